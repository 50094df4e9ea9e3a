"""What the workers of a shared study agree on: what the study is for, when its budget
began, and one verified result for all of them.

Several machines (or several processes of one) run ``autotune run FILE --storage URL
--study NAME``. The first to open the study records what it was created for: the machine
fingerprint, the model file and the search space; a later worker whose own differ is
refused, naming the difference, since its measurements would mix with the others' in one
ranking. When the budget is spent, the first worker to take the study's verification lock
verifies and publishes the result document in the study; the others wait for it and write
the same outputs, so every machine emits the same verified configuration. A verifier that
dies releases the lock with its database session, and a waiting worker verifies instead.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import optuna
import optuna.storages

from autotune.errors import AutotuneError, UsageError
from autotune.probes import fingerprint_diff
from autotune.runtime.json_value import JsonObject, JsonValue
from autotune.schemas.typed import Record
from autotune.search.study import study_lock
from autotune.trials.protocol import StudyAttr


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelFile(Record):
    """The model file as a study knows it: its name and the hash of its text (the same file
    on every machine)."""

    name: str
    sha256: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudyIdentity(Record):
    """What a study is for: the machine's fingerprint, the model file and the search
    space (``Space.describe``: each part's knobs)."""

    fingerprint: Mapping[str, JsonValue]
    model_file: ModelFile
    space: Mapping[str, Mapping[str, JsonValue]]

    @classmethod
    def of(cls, *, fingerprint: Mapping[str, JsonValue], model_file: Path,
           space: Mapping[str, JsonValue]) -> StudyIdentity:
        # as the study stores it (lists, not tuples), so that a worker's compares equal
        return cls.from_json(json.loads(json.dumps({
            "fingerprint": fingerprint, "space": space,
            "model_file": {"name": model_file.name, "sha256": hashlib.sha256(model_file.read_bytes()).hexdigest()},
        }, default=str)))

    def differences(self, mine: StudyIdentity) -> list[str]:
        """How ``mine`` differs from what the study was created for (this); [] when it does not."""
        out = [f"machine: {line} (the study's -> this machine's)"
               for line in fingerprint_diff(self.fingerprint, mine.fingerprint)]
        theirs, ours = self.model_file, mine.model_file
        if theirs != ours:
            out.append(f"model file: {theirs.name} (sha256 {theirs.sha256[:12]}) in the "
                       f"study, {ours.name} (sha256 {ours.sha256[:12]}) here")
        for part in sorted(set(self.space) | set(mine.space)):
            a, b = self.space.get(part, {}), mine.space.get(part, {})
            for knob in sorted(set(a) | set(b)):
                if a.get(knob) != b.get(knob):
                    out.append(f"search space ({part}) {knob}: {a.get(knob)!r} in the study, {b.get(knob)!r} here")
        return out


def join(study: optuna.Study, storage: optuna.storages.RDBStorage, *, lock_name: str,
         mine: StudyIdentity) -> float:
    """Record what ``study`` is for, or check that this worker matches it (UsageError naming
    each difference); returns when the study's first worker began (its budget's start)."""
    with study_lock(storage, lock_name):
        stored = study.user_attrs.get(StudyAttr.IDENTITY)
        if stored is None:
            study.set_user_attr(StudyAttr.IDENTITY, mine.to_json())
            study.set_user_attr(StudyAttr.STARTED_AT, time.time())
        else:
            diff = StudyIdentity.from_json(stored).differences(mine)
            if diff:
                raise UsageError(
                    f"this worker cannot join the study {study.study_name!r}: "
                    + "; ".join(diff)
                    + ". Every worker of a shared study must be the same kind of machine, with the "
                      "same model file and options; run this one with another --study.")
        return float(study.user_attrs.get(StudyAttr.STARTED_AT) or time.time())


class WaitedTooLong(AutotuneError):
    """Another worker held the verification for longer than this one waits."""


def verify_once(study: optuna.Study, storage: optuna.storages.RDBStorage, *, lock_name: str,
                verify: Callable[[], JsonObject], wait_s: float, notice: Callable[[str], None],
                poll_s: float = 2.0) -> tuple[JsonObject, bool]:
    """The study's published result; verified here (``verify()``, under the study's
    verification lock, then published) when no worker has, else waited for. Returns it
    and whether this worker verified it."""
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        published = study.user_attrs.get(StudyAttr.PUBLISHED)
        if published is not None:
            return published, False
        with study_lock(storage, lock_name, wait=False) as taken:
            if taken:
                published = study.user_attrs.get(StudyAttr.PUBLISHED)
                if published is not None:  # published between the look and the lock
                    return published, False
                result = verify()
                study.set_user_attr(StudyAttr.PUBLISHED, result)
                return result, True
        if time.monotonic() > deadline:
            raise WaitedTooLong(
                f"another worker has been verifying the study {study.study_name!r} for more than "
                f"{wait_s:.0f} s; its result was not published. Run this command again to wait "
                "longer (--verify-wait), or give the study's other workers time to finish.")
        if not told:
            notice(f"another worker is verifying the study {study.study_name!r}; waiting for its "
                   f"result (at most {wait_s:.0f} s)")
            told = True
        time.sleep(poll_s)
