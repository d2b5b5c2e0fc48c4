"""Where a conformance case interrupts, as hypothesis draws it (the suite and the bench share it)."""

from __future__ import annotations

from hypothesis import strategies as st

from .harness import POINTS, Interruption


def interruptions(first: str = POINTS[0]) -> st.SearchStrategy[list[Interruption]]:
    """One or two interruptions; `first` is the phase of the simplest example (what a
    derandomized run with few examples tries first), so each script starts somewhere else."""
    phases = [first] + [p for p in POINTS if p != first]
    # Shifted so the simplest example interrupts mid-run (0.5), not at a phase's first arrival.
    fracs = st.floats(min_value=0.0, max_value=0.99).map(lambda f: round((f + 0.5) % 1.0, 3))
    return st.lists(st.builds(Interruption, phase=st.sampled_from(phases), frac=fracs,
                              mode=st.sampled_from(["notice", "kill"])),
                    min_size=1, max_size=2)
