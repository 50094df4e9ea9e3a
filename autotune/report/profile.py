"""The report's part on where the emitted configuration's step goes (best_config.json's
``step_profile``): a table of its shares, and advice only where a share says something
the search's own trials can back."""
from __future__ import annotations

from collections.abc import Iterable

from autotune.document.run import RunDocument
from autotune.runtime.knobs import Device, Precision
from autotune.runtime.shares import Category

# A share of the step above which the data loading is named as the bound.
DATA_BOUND = 0.2
# On a GPU, idle above this share: the device waits for the host to launch work.
GPU_IDLE = 0.3
# Convolutions above this share: the step is theirs, and what they run with (their memory
# layout, cuDNN's algorithm search, the precision) is what moves it.
CONVOLUTION_BOUND = 0.5

TITLE = "Where the step goes"
HEADERS = ("part of the step", "share", "ms a step")


def table_rows(doc: RunDocument) -> list[list[str]]:
    """The profile's categories with a share, largest first: [part, share, ms per step]."""
    profile = doc.step_profile
    if profile is None:
        return []
    return [[category.label, f"{share:.1%}", f"{share * profile.step_ms:.2f}"]
            for category, share in profile.ranked()]


def table_note(doc: RunDocument) -> str:
    profile = doc.step_profile
    if profile is None:
        return ""
    return (f"{profile.steps} steps of the emitted configuration ({doc.config.short()}) under torch.profiler, "
            f"after its warm-up: {profile.step_ms:.2f} ms a step on {profile.device}, divided by {profile.source}")


def _workers(doc: RunDocument, tried: Iterable[str] | None) -> str:
    """What the search did with DataLoader workers beyond the emitted number."""
    chosen = doc.config.num_workers
    space = [v for v in doc.included.get("num_workers", []) if isinstance(v, int) and v > chosen]
    if not space:
        return (f"the search had no more DataLoader workers to try than the {chosen} it runs with"
                if "num_workers" in doc.included else "the search did not vary DataLoader workers")
    if tried is None:
        return f"the search's space held more workers ({', '.join(map(str, space))}) than the {chosen} it runs with"
    seen = {str(v) for v in tried}
    lost = [v for v in space if str(v) in seen]
    untried = [v for v in space if str(v) not in seen]
    parts = []
    if lost:
        parts.append(f"more workers ({', '.join(map(str, lost))}) were tried and lost to {chosen}")
    if untried:
        parts.append(f"{', '.join(map(str, untried))} workers were not tried")
    return "; ".join(parts)


def _convolutions(doc: RunDocument) -> str:
    """How the emitted configuration runs its convolutions, and the values of the knobs
    that change them which the search's space held beside its own."""
    cfg = doc.config
    cuda = cfg.device == Device.CUDA
    how = [f"in {cfg.precision}", f"channels_last {'on' if cfg.channels_last else 'off'}"]
    if cuda:
        how.append(f"cuDNN's benchmark {'on' if cfg.cudnn_benchmark else 'off'}")
    held = []
    for knob, value in (("channels_last", True), ("cudnn_benchmark", True), ("precision", Precision.BF16.value),
                        ("precision", Precision.FP16.value)):
        if getattr(cfg, knob) != value and value in doc.included.get(knob, []):
            held.append(f"{knob}={str(value).lower()}")
    text = "they run " + ", ".join(how)
    if held:
        return f"{text}; the search's space held {', '.join(held)} as well, which the pick does not use"
    return f"{text}; the search's space held no other layout, cuDNN benchmark or 16-bit precision for them"


def advice_lines(doc: RunDocument, *, workers_tried: Iterable[str] | None = None) -> list[str]:
    """Where the step goes, in a line, and what a large share says: ``workers_tried``,
    the num_workers values the search's trials ran with (None: no study to read)."""
    profile = doc.step_profile
    if profile is None:
        return []
    top = ", ".join(f"{c.label} {s:.0%}" for c, s in profile.ranked()[:3])
    lines = [f"where the step goes ({profile.step_ms:.2f} ms, profiled): {top}."]
    data = profile.share(Category.DATA_WAIT)
    if data >= DATA_BOUND:
        lines.append(f"  the step waits on the DataLoader {data:.0%} of the time: {_workers(doc, workers_tried)}; "
                     "the data set's __getitem__ (or the collate function) is the bound: make it cheaper "
                     "(decode or augment once, cache, or move the work to the device).")
    conv = profile.share(Category.CONVOLUTION)
    if conv >= CONVOLUTION_BOUND:
        lines.append(f"  convolutions take {conv:.0%} of the step: {_convolutions(doc)}.")
    idle = profile.share(Category.IDLE)
    if profile.source == "gpu kernels" and idle >= GPU_IDLE:
        compiled = doc.config.compile != "off"
        lines.append(f"  the GPU runs no kernel {idle:.0%} of the step: the host does not launch work fast enough"
                     + ("" if compiled else "; torch.compile (fewer, larger kernels) or a larger batch would fill it")
                     + ".")
    return lines
