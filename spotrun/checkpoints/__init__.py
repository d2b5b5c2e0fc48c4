"""Torch-free checkpoints: one checkpoint's files and manifest, the job's persisted files
captured with it, and the checkpoint folders of a job's store (list, verify, resume, retain)."""

from spotrun.checkpoints.folders import (  # noqa: F401
    FORMAT, INDEX, MANIFEST, TORCH_KIND, TORCH_META, Manifest, apply_retention, check_file,
    check_layout, checkpoint_name, checkpoint_step, latest_verified, list_complete, list_names,
    put_checkpoint_files, read_manifest, resume_point, sha256_hex, torch_shard_name, verify,
    write_manifest)
