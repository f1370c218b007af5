"""Every exception of fabric/errors.py imports from ``sdk``: the README and docs/QUEUES.md
name them bare (``TopicAlreadyExistsError``, ``LeaseNotHeldError``, ...), and a developer
writing ``from sdk import TopicAlreadyExistsError`` got an ImportError for all but the
direct plane's."""

from __future__ import annotations

import inspect

import sdk
from fabric import errors


def _error_classes() -> dict[str, type[errors.FabricError]]:
    return {name: value for name, value in vars(errors).items()
            if inspect.isclass(value) and issubclass(value, errors.FabricError)
            and value.__module__ == errors.__name__ and not name.startswith("_")}


def test_every_fabric_error_imports_from_sdk_as_the_same_class() -> None:
    classes = _error_classes()
    assert len(classes) >= 70 and "TopicAlreadyExistsError" in classes and "NoBrokersAvailableError" in classes
    missing = sorted(name for name in classes if getattr(sdk, name, None) is not classes[name])
    assert not missing, f"not exported by sdk: {missing}"
    unlisted = sorted(name for name in classes if name not in sdk.__all__)
    assert not unlisted, f"not in sdk.__all__: {unlisted}"


def test_sdk_all_names_only_what_sdk_has() -> None:
    assert len(sdk.__all__) == len(set(sdk.__all__))
    assert [name for name in sdk.__all__ if not hasattr(sdk, name)] == []
