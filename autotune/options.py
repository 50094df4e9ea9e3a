"""What a run is asked to do, every default of it, and how a user spells each option:
defined once, one field of ``RunOptions`` per option.

Each field's ``metadata[FLAG]`` (a ``Flag``) says how the option is spelled on the command
line and in ``tune()``, its help text, and whether best_config.json may show it. The
parsers of ``autotune run`` and ``autotune verify`` (``autotune.commands``), the
keywords of ``autotune.tune`` (``autotune.api``) and the document's record of the options
(``autotune.document.options``) are built from these fields: a field added here is a
flag, a keyword and a recorded option. Cheap to import: the commands parse their options
without loading the run's machinery.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from autotune.config import LR_FIELDS, LR_SCALINGS, KnobValue, Layout, TrialConfig
from autotune.errors import UsageError
from autotune.runtime.knobs import LrScaling, Precision

# Where --storage is read from when not given: a URL with a password stays out of the
# shell's history and the process list.
STORAGE_ENV = "AUTOTUNE_STORAGE"
# The search's share of --timeout at most (less where verification's least needs more);
# verification gets the rest (autotune.verify.deadline), and fits its stages to it.
# Half: what the search does not find, verification cannot verify; and verification at its
# least (the reserve keeps it) is far less than half of a few minutes.
SEARCH_SHARE = 0.5


_UNITS = {"k": 2**-10, "m": 1.0, "g": 2**10, "t": 2**20}


def parse_size(text: str, *, flag: str = "--memory-limit") -> float:
    """``"6GiB"``, ``"6G"``, ``"6000MiB"``, ``"512M"`` -> MiB (binary units; a bare number is
    refused, since MiB and GiB differ by a thousand)."""
    body = str(text).strip().lower().removesuffix("ib").removesuffix("b")
    unit = body[-1:] if body[-1:] in _UNITS else ""
    try:
        value = float(body[: len(body) - len(unit)])
    except ValueError:
        value = -1.0
    if not unit or value <= 0:
        raise UsageError(f"{flag} {text!r}: expected a size with its unit, e.g. {flag} 6GiB "
                         f"or {flag} 800MiB")
    return value * _UNITS[unit]


def parse_batch_range(text: str) -> tuple[int, int]:
    """``"16-1024"`` -> (16, 1024): the global batch sizes the search may try."""
    low, sep, high = str(text).strip().partition("-")
    try:
        bounds = (int(low), int(high)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None or not 1 <= bounds[0] <= bounds[1]:
        raise UsageError(f"--batch-range {text!r}: expected LOW-HIGH, two whole numbers with 1 <= LOW <= HIGH, "
                         "e.g. --batch-range 16-1024")
    return bounds


def parse_metric(text: str) -> str:
    """``--metric``'s regular expression, checked: it compiles, and has at most one group
    (the number it captures; without a group, the whole match is the number)."""
    try:
        groups = re.compile(str(text)).groups
    except re.error as exc:
        raise UsageError(f"--metric {text!r}: not a regular expression ({exc}). Give one that matches the line your "
                         r"script prints, its number in a group: --metric 'val_acc (\S+)'") from None
    if groups > 1:
        raise UsageError(f"--metric {text!r}: {groups} groups; give one, around the number: "
                         r"--metric 'val_acc (\S+)' (write (?:...) for a group that is not the number)")
    return str(text)


def _metric(given: Any, spelled: str) -> str | None:
    return None if given is None else parse_metric(given)


def parse_scale_lr(text: str) -> str:
    """``"linear"`` -> ``LrScaling.LINEAR``'s value; anything else is refused with the choices."""
    try:
        return LrScaling(str(text).strip().lower()).value
    except ValueError:
        choices = ", ".join(r.value for r in LrScaling)
        raise UsageError(f"--scale-lr {text!r}: expected one of {choices}, e.g. --scale-lr linear "
                         "(the learning rate times the tuned batch over yours)") from None


# A Flag's parse: what the user gave (text on the command line; text or the value itself
# in tune()) and how they spelled the option -> the field's value, or a UsageError.

# Knobs the user may pin with --fix, with how to read their value.
_BOOL = {"true": True, "1": True, "yes": True, "on": True,
         "false": False, "0": False, "no": False, "off": False}


def _parse_value(field: dataclasses.Field[Any], text: str) -> Any:
    kind = str(field.type)
    if text.lower() in ("none", "default") and "None" in kind:
        return None
    try:
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
        if kind.startswith("bool"):
            return _BOOL[text.lower()]
    except (ValueError, KeyError):
        raise UsageError(f"--fix {field.name}={text}: expected {kind.replace(' | None', '')}") from None
    return text


def parse_fixes(items: list[str]) -> dict[str, KnobValue]:
    """``["batch_size=64", "precision=fp32"]`` -> typed values; unknown knobs are errors."""
    fields = {f.name: f for f in dataclasses.fields(TrialConfig)}
    fixed: dict[str, KnobValue] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--fix {item!r}: expected KNOB=VALUE, e.g. --fix batch_size=64")
        if name == "layout":  # as progress lines print it: both knobs at once
            try:
                fixed["nprocs"], fixed["threads"] = Layout.parse(text)
            except UsageError as exc:
                raise UsageError(f"--fix {exc}") from None
            continue
        if name in LR_FIELDS:
            raise UsageError(f"--fix {name}: the learning rate's rule is not a knob; give --scale-lr "
                             f"{{{','.join(LR_SCALINGS)}}} (scale_lr= in tune()), and it follows each "
                             "configuration's batch size from yours")
        if name not in fields:
            raise UsageError(
                f"--fix {name}: unknown knob. Knobs: "
                f"{', '.join(sorted([*(f for f in fields if f not in LR_FIELDS), 'layout']))}"
            )
        fixed[name] = _parse_value(fields[name], text.strip())
    try:
        ranks = fixed.get("nprocs", 1)  # a batch they split, so that only the pins are judged
        TrialConfig.from_dict({"batch_size": ranks if isinstance(ranks, int) else 1, **fixed})
    except UsageError as exc:
        raise UsageError(f"--fix: {exc}") from None
    return fixed


def _size(given: Any, spelled: str) -> float:
    return parse_size(given, flag=spelled) if isinstance(given, str) else given


def _batch_range(given: Any, spelled: str) -> tuple[int, int]:
    return parse_batch_range(given) if isinstance(given, str) else given  # a tuple: checked by RunOptions


def _fixes(given: Mapping[str, KnobValue] | Iterable[str], spelled: str) -> dict[str, KnobValue]:
    """``{"batch_size": 64}`` or ``["batch_size=64"]`` (repeated --fix) -> typed knob values."""
    items = [f"{k}={v}" for k, v in given.items()] if isinstance(given, Mapping) else list(given)
    return parse_fixes(items)


@dataclasses.dataclass(frozen=True)
class Group:
    """A section of ``autotune run --help``: options that only make sense together."""

    title: str
    description: str


PLANNED_RUN = Group(
    "the run you plan",
    "Rank configurations by the predicted wall time of that run, one-time costs (compiling, "
    "warm-up, DataLoader start) included, instead of by steady throughput; give one of them.")
SHARED_STUDY = Group(
    "a study shared by several machines",
    "Each machine runs the same command with the same --storage and --study: they share one "
    "budget, and one of them verifies the result for all.")


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a user spells and sees one option of ``RunOptions``: a field's ``metadata[FLAG]``.

    A field's default is the flag's default. A bool field is a switch: giving the flag sets
    the opposite of the default (``--no-profile`` turns ``profile`` off).
    """

    name: str  # on the command line, e.g. "--trials"
    _: dataclasses.KW_ONLY
    # argparse's help text: "%(default)s" (or "%(default).0f") is the field's default
    help: str
    metavar: str | None = None  # None: the flag's name in capitals (--trials TRIALS)
    # The flag's text is a number of this type, checked by the parser (a usage message):
    # positive unless ``positive`` is False.
    number: type[int] | type[float] | None = None
    positive: bool = True
    # What the user gave -> the field's value (see _size): on the command line after
    # parsing, in tune() for whatever is given.
    parse: Callable[[Any, str], Any] | None = None
    repeat: bool = False  # the flag may be given several times; parse gets the list
    group: Group | None = None  # None: autotune run's general options
    verify: bool = False  # also an option of ``autotune verify`` (how re-runs are measured)
    api: str | None = None  # tune()'s keyword, where it is not the field's name
    env: str | None = None  # the command line reads it from this variable when not given
    # Never written to best_config.json nor printed (a database URL with its password).
    secret: bool = False


FLAG = "autotune.flag"  # the metadata key of a field's Flag


def flag_of(field: dataclasses.Field[Any]) -> Flag | None:
    """The field's Flag; None: an option of tune() and best_config.json alone."""
    return field.metadata.get(FLAG)


def keyword_of(field: dataclasses.Field[Any]) -> str:
    """The option's keyword in ``tune()``."""
    flag = flag_of(field)
    return flag.api if flag is not None and flag.api else field.name


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What a run is asked to do; the CLI's options, by name, in the order --help lists
    them."""

    trials: int = dataclasses.field(default=20, metadata={FLAG: Flag(
        "--trials", number=int, help="measured trials in the search (default %(default)s)")})
    # --timeout bounds the whole run: the search gets SEARCH_SHARE of it, verification's
    # stages are fitted to the rest (verify.fit). None: no bound.
    timeout_s: float | None = dataclasses.field(default=None, metadata={FLAG: Flag(
        "--timeout", number=float, metavar="SECONDS", api="timeout",
        help="bound the whole run, verification included: the search starts no trial "
             f"after {SEARCH_SHARE * 100:.0f}%% of it, and verification's stages are fitted to the rest")})
    fixed: Mapping[str, KnobValue] = dataclasses.field(default_factory=dict, metadata={FLAG: Flag(
        "--fix", repeat=True, parse=_fixes, metavar="KNOB=VALUE", api="fix",
        help="pin a knob, e.g. --fix batch_size=64 (repeatable)")})
    exact: bool = dataclasses.field(default=False, metadata={FLAG: Flag(
        "--exact", help="keep everything in fp32 and unpruned (no reduced precision)")})
    top: int = dataclasses.field(default=1, metadata={FLAG: Flag(
        "--top", number=int,
        help="best-ranked candidates re-measured in verification, besides the first one's "
             "layout contrast, the best of the other process layout and the best exact "
             "and reduced-precision ones (default %(default)s)")})
    # --batch-range: the global batch sizes the search may try (LOW, HIGH); None: the range
    # measured on the machine (search.batch_range).
    batch_range: tuple[int, int] | None = dataclasses.field(default=None, metadata={FLAG: Flag(
        "--batch-range", parse=_batch_range, metavar="LOW-HIGH",
        help="the global batch sizes the search may try, e.g. 16-1024: their powers of two and "
             "both ends (default: a quarter to eight times the model file's batch_size)")})
    # --scale-lr: how the learning rate follows a batch size unlike the user's (LrScaling);
    # "none" leaves it as the model file sets it.
    scale_lr: str = dataclasses.field(default=LrScaling.NONE.value, metadata={FLAG: Flag(
        "--scale-lr", metavar="{" + ",".join(r.value for r in LrScaling) + "}",
        help="how the learning rate follows a tuned batch size unlike the model file's: "
             "linear multiplies it by the tuned batch over yours, sqrt by that ratio's square "
             "root, in every trial, the verification and the emitted script "
             "(default %(default)s: unchanged)")})
    # --memory-limit: the most memory one rank may hold, in MiB (host memory on CPU, device
    # memory on CUDA); None: what the machine has, less a margin (search.memory).
    memory_limit_mb: float | None = dataclasses.field(default=None, metadata={FLAG: Flag(
        "--memory-limit", parse=_size, metavar="SIZE", api="memory_limit",
        help="the most memory one rank may hold, e.g. 6GiB: host memory per process on CPU, "
             "memory per GPU on CUDA; a configuration over it is not chosen, and one that "
             "runs out of memory is tried again with activation checkpointing, gradient "
             "accumulation or sharding (default: what the machine has, less a margin)")})
    # The ablation's path from the baseline, one knob added at a time: as many processes
    # again as the leave-one-out that decides what is emitted, and it decides nothing, so it
    # is measured only on request.
    path: bool = dataclasses.field(default=False, metadata={FLAG: Flag(
        "--path",
        help="also measure the path from the baseline to the winner, one knob added at a "
             "time (the steps multiply to the whole speedup); as many processes again as "
             "the ablation's knob-by-knob measurement")})
    # After the outputs are written, one window of the emitted script under torch.profiler:
    # where its step goes (best_config.json's step_profile); False: --no-profile.
    profile: bool = dataclasses.field(default=True, metadata={FLAG: Flag(
        "--no-profile",
        help="skip the step profile: one window of the emitted script under torch.profiler, "
             "a few seconds after verification, that says where its step goes")})
    # The run the user plans (autotune.task.objective.PlannedRun): steps at their own batch
    # size, or passes over the data set; at most one. None of them: the search ranks by
    # steady throughput, as for a run of endless length.
    train_steps: int | None = dataclasses.field(default=None, metadata={FLAG: Flag(
        "--train-steps", number=int, metavar="N", group=PLANNED_RUN,
        help="steps of your batch size (default: none, steady throughput)")})
    epochs: int | None = dataclasses.field(default=None, metadata={FLAG: Flag(
        "--epochs", number=int, metavar="E", group=PLANNED_RUN,
        help="passes over the data set (default: none, steady throughput)")})
    # A shared study (search.shared): its database URL (a secret: never printed, see
    # search.study.shown_url), its name, how often a worker's running trial says it is
    # alive, and how long a worker waits for another one's verification.
    storage: str | None = dataclasses.field(default=None, repr=False, metadata={FLAG: Flag(
        "--storage", metavar="URL", group=SHARED_STUDY, env=STORAGE_ENV, secret=True,
        help="the study's PostgreSQL database, e.g. postgresql://USER:PASSWORD@HOST/DB "
             f"(default: ${STORAGE_ENV}, else a journal file in the output folder); "
             "needs pip install 'autotune[postgres]'")})
    study: str | None = dataclasses.field(default=None, metadata={FLAG: Flag(
        "--study", metavar="NAME", group=SHARED_STUDY,
        help="the study's name (default: the model file's name and the machine's fingerprint)")})
    heartbeat_s: int = dataclasses.field(default=10, metadata={FLAG: Flag(
        "--heartbeat", number=int, metavar="SECONDS", group=SHARED_STUDY,
        help="how often a worker's running trial says it is alive; one silent for 3x that "
             "is failed and measured again (default %(default)s)")})
    verify_wait_s: float = dataclasses.field(default=3600.0, metadata={FLAG: Flag(
        "--verify-wait", number=float, metavar="SECONDS", group=SHARED_STUDY,
        help="how long a worker waits for another one's verification (default %(default).0f)")})
    # How trials are measured and verified: autotune verify's options too.
    window_s: float = dataclasses.field(default=1.0, metadata={FLAG: Flag(
        "--window", number=float, verify=True, help="seconds per measurement window (default %(default)s)")})
    windows: int = dataclasses.field(default=3, metadata={FLAG: Flag(
        "--windows", number=int, verify=True, help="measurement windows per trial (default %(default)s)")})
    trial_timeout_s: float = dataclasses.field(default=300.0, metadata={FLAG: Flag(
        "--trial-timeout", number=float, verify=True,
        help="seconds before a trial is killed (default %(default).0f)")})
    hang_timeout_s: float = dataclasses.field(default=30.0, metadata={FLAG: Flag(
        "--hang-timeout", number=float, metavar="SECONDS", verify=True,
        help="seconds without a finished step before a trial counts as hung (default "
             "%(default).0f; five of the trial's own steps where a step "
             "takes longer); setup may take 5x the model file's check, at least 60 s")})
    # The most side-by-side rounds and standalone pairs: each stops earlier once settled
    # (verify.sequential).
    rounds: int = dataclasses.field(default=10, metadata={FLAG: Flag(
        "--rounds", number=int, verify=True,
        help="the most rounds of side-by-side windows that rank the candidates in "
             "verification; they stop once the ranking is settled (default %(default)s)")})
    pairs: int = dataclasses.field(default=6, metadata={FLAG: Flag(
        "--pairs", number=int, verify=True,
        help="pairs of standalone runs (the emitted launch.sh and the baseline's script, each "
             "alone) that give the printed speedup; they stop from the 3rd once the figure a re-run "
             "stays above is settled, and go on up to twice this where it could still clear 1x "
             "(default %(default)s)")})
    # Timed training per standalone run, after its warm-up: DataLoader workers ramp up
    # over the first seconds, and shorter runs printed speedups below what an independent
    # check of longer runs measured (BENCHMARKS.md, "Standalone runs of 8 s").
    pair_seconds: float = dataclasses.field(default=8.0, metadata={FLAG: Flag(
        "--pair-seconds", number=float, metavar="SECONDS", verify=True,
        help="timed training per standalone run, after its warm-up (default %(default).0f)")})
    max_quality_drop: float | None = dataclasses.field(default=None, metadata={FLAG: Flag(
        "--max-quality-drop", number=float, positive=False, metavar="X", verify=True,
        help="how far the evaluate() metric may drop: allows structured pruning, and "
             "replaces the default allowance for reduced precision (2%% of the metric)")})
    # A plain loop's quality: the metric it prints (``verify.printed``); None: its batch is kept
    # within eight times the user's and unchecked, as for a model file without evaluate().
    metric: str | None = dataclasses.field(default=None, metadata={FLAG: Flag(
        "--metric", parse=_metric, metavar="REGEX",
        help="for a plain training loop: a regular expression for the metric your script prints, its "
             r"number in a group (--metric 'val_acc (\S+)'); the quality checks run your script to "
             "its next print of it and compare there (higher is better unless --metric-lower-is-better)")})
    metric_lower_is_better: bool = dataclasses.field(default=False, metadata={FLAG: Flag(
        "--metric-lower-is-better",
        help="--metric's number is better lower (a loss), not higher (an accuracy)")})
    # Configurations with the same process knobs measured one after another in one process
    # (autotune.trials.runner.process_key); False: each in a fresh process.
    warm_trials: bool = dataclasses.field(default=True, metadata={FLAG: Flag(
        "--fresh-trials", verify=True,
        help="measure every configuration in a fresh process (by default configurations "
             "that share the process knobs run one after another in one warm process)")})

    def __post_init__(self) -> None:
        if self.pairs < 2:
            raise UsageError(f"--pairs {self.pairs}: at least 2 (the speedup's interval needs two pairs)")
        if self.heartbeat_s < 1:
            raise UsageError("--heartbeat must be at least 1 second")
        for flag, count in (("--train-steps", self.train_steps), ("--epochs", self.epochs)):
            if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
                raise UsageError(f"{flag} {count!r}: expected a positive whole number, e.g. {flag} 1000")
        if self.train_steps is not None and self.epochs is not None:
            raise UsageError("--train-steps and --epochs both describe the run you plan: give one of them")
        if self.memory_limit_mb is not None and not self.memory_limit_mb > 0:
            raise UsageError(f"--memory-limit {self.memory_limit_mb!r}: expected a positive size in MiB")
        if self.batch_range is not None:
            parse_batch_range("-".join(map(str, self.batch_range)))  # the same checks, the same message
            if "batch_size" in self.fixed:
                raise UsageError(f"--batch-range and --fix batch_size={self.fixed['batch_size']} both set the "
                                 "batch size: give one of them")
        # the vocabulary's value (tune() may pass an LrScaling, or "Linear")
        object.__setattr__(self, "scale_lr", parse_scale_lr(self.scale_lr))
        if self.max_quality_drop is not None and self.max_quality_drop < 0:
            raise UsageError("--max-quality-drop must be 0 or more")
        if self.exact:
            for knob, exact_value in (("precision", Precision.FP32), ("prune_ratio", 0.0)):
                if self.fixed.get(knob, exact_value) != exact_value:
                    raise UsageError(f"--exact keeps {knob}={exact_value}, but --fix "
                                     f"{knob}={self.fixed[knob]} asks otherwise: drop one of them")
