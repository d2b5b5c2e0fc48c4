"""Object stores behind one interface; backends found by URI scheme in STORES."""

from __future__ import annotations

from typing import Callable
from urllib.parse import urlparse

from spotrun.errors import ConfigError
from spotrun.store.base import (ObjectInfo, ObjectStore, ProgressFn, StoreFeature, join_key,
                                validate_key)
from spotrun.store.file import FileStore

StoreFactory = Callable[[str], ObjectStore]


def _file(uri: str) -> ObjectStore:
    return FileStore.from_uri(uri)


def _s3(uri: str) -> ObjectStore:
    from spotrun.store.s3 import S3Store  # boto3 only when asked for
    return S3Store.from_uri(uri)


def _gs(uri: str) -> ObjectStore:
    try:
        from spotrun.store.gcs import GcsStore  # google-cloud-storage only when asked for
    except ImportError as exc:
        raise ConfigError(f"the gs:// store needs google-cloud-storage ({exc.name or exc})",
                          field="store_uri", value=uri,
                          hint="pip install 'spotrun[gcp]'") from None
    return GcsStore.from_uri(uri)


STORES: dict[str, StoreFactory] = {"file": _file, "s3": _s3, "gs": _gs}


def open_store(uri: str) -> ObjectStore:
    """The store for uri (`file:///abs/path`, `s3://bucket/prefix` or `gs://bucket/prefix`)."""
    scheme = urlparse(uri).scheme
    factory = STORES.get(scheme)
    if factory is None:
        raise ConfigError(f"unsupported store scheme {scheme!r}; allowed: {', '.join(STORES)}",
                          field="store_uri", value=uri)
    return factory(uri)


__all__ = ["ObjectInfo", "ObjectStore", "ProgressFn", "STORES", "StoreFeature", "join_key",
           "open_store", "validate_key"]
