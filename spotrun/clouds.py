"""The clouds one daemon places jobs on (settings `providers`; docs/clouds.md).

Each cloud is read through its own settings view (`cloud_settings`): that provider's facts,
catalog, zones, market and store, exactly as a one-cloud daemon of that provider reads them.
This module says which clouds a job may use, which cloud a store URI belongs to,
and what a spec may name across the clouds configured.
"""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlparse

from spotrun.catalog import Catalog, load_catalog
from spotrun.config import Settings
from spotrun.errors import ConfigError
from spotrun.providers.facts import FACTS, facts_for


def cloud_settings(settings: Settings, cloud: str) -> Settings:
    """The settings a one-cloud daemon of `cloud` would have: its provider, and its own store
    (`<cloud>.store_uri`, else the top-level one)."""
    if cloud not in settings.clouds:
        raise ConfigError(f"cloud {cloud!r} is not configured; allowed: "
                          f"{', '.join(settings.clouds)}", field="providers", value=cloud)
    if settings.clouds == (cloud,) and not settings.providers:
        return settings
    own = FACTS[cloud].store_uri(settings)
    return replace(settings, provider=cloud, providers=(), store_uri=own or settings.store_uri)


def job_clouds(settings: Settings, wanted: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The clouds a job may run on: those its spec names (`resources.clouds`), in the order
    settings list them; every configured cloud when it names none."""
    if not wanted:
        return settings.clouds
    return tuple(c for c in settings.clouds if c in wanted)


def cloud_of_store(settings: Settings, uri: str) -> str | None:
    """The configured cloud a store URI lives in (by its scheme), or None: a `file://` store is
    this machine's, in no cloud (nothing is billed to read it)."""
    scheme = urlparse(uri).scheme
    for cloud in settings.clouds:
        if scheme and FACTS[cloud].store_scheme == scheme:
            return cloud
    return None


def catalogs_of(settings: Settings) -> dict[str, Catalog]:
    """Each configured cloud's catalog, by cloud."""
    return {c: load_catalog(FACTS[c].catalog) for c in settings.clouds}


def spec_types(settings: Settings) -> list[str]:
    """Every instance type a spec may name: each configured cloud's catalog, in order."""
    names: dict[str, None] = {}
    for cloud in settings.clouds:
        names.update(dict.fromkeys(load_catalog(FACTS[cloud].catalog).names()))
    return list(names)


def spec_zones(settings: Settings) -> list[str]:
    """Every zone a spec may name: each configured cloud's zones."""
    zones: dict[str, None] = {}
    for cloud in settings.clouds:
        view = cloud_settings(settings, cloud)
        zones.update(dict.fromkeys(facts_for(view).known_zones(view)))
    return list(zones)


def spec_catalog_label(settings: Settings) -> str:
    """How an unknown type's error names the catalogs in use: "the gcp provider's catalog
    (gcp.yaml)", or every cloud's with several."""
    files = ", ".join(f"{FACTS[c].catalog}.yaml" for c in settings.clouds)
    if len(settings.clouds) == 1:
        return f"the {settings.clouds[0]} provider's catalog ({files})"
    return f"the catalogs of {' and '.join(settings.clouds)} ({files})"


def check_clouds(settings: Settings) -> None:
    """Several clouds: each has its own store, and no zone is claimed by two (a zone names
    one cloud's pool). ConfigError naming the key otherwise."""
    if len(settings.clouds) < 2:
        return
    seen: dict[str, str] = {}
    for cloud in settings.clouds:
        view = cloud_settings(settings, cloud)
        # The home cloud (the first) may keep its store in the top-level `store_uri`.
        home = cloud == settings.clouds[0]
        if not (FACTS[cloud].store_uri(settings) or (home and settings.store_uri)):
            raise ConfigError(f"with several clouds each needs its own store; allowed: "
                              f"{FACTS[cloud].store_scheme}://bucket/prefix",
                              field=f"{cloud}.store_uri", value="")
        if cloud_of_store(settings, view.store_url) != cloud:
            raise ConfigError(f"must be a {FACTS[cloud].store_scheme}:// store (the {cloud} "
                              f"cloud's own)", field=f"{cloud}.store_uri", value=view.store_url)
        for zone in facts_for(view).known_zones(view):
            if zone in seen:
                raise ConfigError(f"zone {zone!r} is both {seen[zone]}'s and {cloud}'s",
                                  field="providers", value=list(settings.clouds))
            seen[zone] = cloud
