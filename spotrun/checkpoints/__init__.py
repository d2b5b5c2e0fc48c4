"""Torch-free checkpoints: one checkpoint's files and manifest (manifests), the job's persisted
files captured with it (jobfiles), and the checkpoint folders of a job's store: list, verify,
resume, retain (folders)."""

from spotrun.checkpoints.folders import (  # noqa: F401
    INDEX, apply_retention, latest_verified, list_complete, list_names, resume_point, verify)
from spotrun.checkpoints.manifests import (  # noqa: F401
    FORMAT, MANIFEST, TORCH_KIND, TORCH_META, Manifest, check_file, check_layout,
    checkpoint_name, checkpoint_step, put_checkpoint_files, read_manifest, sha256_hex,
    torch_shard_name, write_manifest)
