"""State enums: terminal states, and the string values users see in `status --json`."""

from __future__ import annotations

from spotrun.states import AttemptState, InstanceState, JobState


def test_job_terminal_states():
    terminal = {s for s in JobState if s.is_terminal()}
    assert terminal == {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                        JobState.BUDGET_EXHAUSTED}
    assert all(s.is_active() != s.is_terminal() for s in JobState)


def test_attempt_and_instance_terminal_states():
    assert [s for s in AttemptState if s.is_terminal()] == [AttemptState.ENDED]
    assert [s for s in InstanceState if s.is_terminal()] == [InstanceState.TERMINATED]


def test_values_are_the_brief_lower_case_names():
    assert {s.value for s in JobState} >= {"queued", "running", "recovering", "succeeded",
                                           "failed", "cancelled", "budget_exhausted"}
    assert all(s.value == s.value.lower() for s in JobState)


def test_transition_table_is_total_and_terminal_states_do_not_run_again():
    from spotrun.states import (ATTEMPT_TRANSITIONS, JOB_TRANSITIONS, TransitionError,
                                move_attempt, move_job)
    assert set(JOB_TRANSITIONS) == set(JobState)
    assert set(ATTEMPT_TRANSITIONS) == set(AttemptState)
    # A finished job never runs twice: nothing leaves succeeded or cancelled.
    for done in (JobState.SUCCEEDED, JobState.CANCELLED):
        assert JOB_TRANSITIONS[done] == frozenset()

    class Row:
        state = JobState.SUCCEEDED
    row = Row()
    import pytest
    with pytest.raises(TransitionError):
        move_job(row, JobState.RECOVERING)
    assert row.state is JobState.SUCCEEDED
    assert move_job(row, JobState.SUCCEEDED) is False     # no change is not an error
    row.state = JobState.RUNNING
    assert move_job(row, JobState.RECOVERING) and row.state is JobState.RECOVERING

    class Att:
        state = AttemptState.ENDED
    with pytest.raises(TransitionError):
        move_attempt(Att(), AttemptState.RUNNING)


def test_node_transitions_end_once_and_never_run_again():
    import pytest
    from spotrun.states import NODE_TRANSITIONS, NodeState, TransitionError, move_node
    assert set(NODE_TRANSITIONS) == set(NodeState)
    assert NODE_TRANSITIONS[NodeState.ENDED] == frozenset()
    assert [s for s in NodeState if s.is_terminal()] == [NodeState.ENDED]

    class Node:
        state = NodeState.LAUNCHING
    n = Node()
    assert move_node(n, NodeState.RUNNING) and move_node(n, NodeState.ENDED)
    with pytest.raises(TransitionError):
        move_node(n, NodeState.RUNNING)
