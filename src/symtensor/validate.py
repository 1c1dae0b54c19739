"""The input boundary: every value a user gives is checked here, once, before the planner sees it.

What comes in: command-line options (``cli_args``), model configs (``hf_config`` for config.json,
``model_config`` for every ModelConfig, however built), cluster files (``read_mapping``, then
``number``/``name`` from ``hardware.cluster``) and plan files (these rules, applied by
``plan.schema``). It imports only ``errors`` and ``output``: the modules that build those values
import it. The rules:

    sizes            positive integers, bounded: a limit names itself (MAX_DEVICES, MAX_LAYERS, ...)
    hardware         finite positive numbers, bounded (latency may be 0)
    booleans         real booleans; the string "false" is refused, never read as true
    names            strings of at most MAX_NAME characters; mesh-level names are identifiers
    files            regular files of at most MAX_FILE_BYTES, UTF-8 text; YAML whose aliases
                     expand to at most MAX_YAML_NODES nodes (no alias bomb)

Each refusal is one ``PlanError`` line: what (the value), where (the option, or the file and its
key), the rule, and the fix.

    >>> integer(8, "--devices", hi=MAX_DEVICES)
    8
    >>> integer(0, "--tp")
    Traceback (most recent call last):
    ...
    symtensor.errors.PlanError: --tp must be a positive integer, got 0
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import stat
from pathlib import Path

from symtensor.errors import PlanError

MAX_FILE_BYTES = 8 * 2**20  # a 405B plan file is ~50 kB, a config.json ~2 kB
MAX_YAML_NODES = 1_000_000  # a cluster file with measured tables has ~10^4
MAX_NAME = 256  # a file name's length, as a model named after its file may be
MAX_DEVICES = 2**20  # 1,048,576 devices; the mesh is the prime factorisation of the count
MAX_LAYERS = 1024  # the zoo's deepest model has 128; 1,024 layers plan in ~15 s
MAX_SEQ = 2**24  # tokens per sequence
MAX_CONTEXT = 2**27  # max_position_embeddings (a hint only)
MAX_BATCH = 2**24  # sequences per step
MAX_WIDTH = 2**20  # hidden, ffn, head_dim, LoRA rank
MAX_HEADS = 2**14
MAX_VOCAB = 2**24
MAX_EXPERTS = 2**14
MAX_LEVELS = 16  # link levels of a cluster
MAX_STEPS = 100_000  # symtensor run
MAX_RUN_PROCESSES = 64  # symtensor run starts one CPU process per device
MAX_TIMEOUT_S = 86_400.0
MAX_SWEEP_POINTS = 64
MAX_CAPACITY_FACTOR = 1024.0
# Hardware constants in cluster-file units; far above any device (H100: 989 TFLOP/s, 3,350 GB/s)
HARDWARE_MAX = {"peak_tflops": 1e6, "hbm_gbps": 1e6, "memory_gib": 1e6, "bandwidth_gbps": 1e6, "latency_us": 1e7}
# the same in SI units, as plan files store them
HARDWARE_MAX_SI = {"peak_flops": 1e18, "hbm_bandwidth": 1e15, "memory": 1e6 * 2**30, "bandwidth": 1e15,
                   "latency": 10.0}

_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


def _show(value) -> str:
    """A value as a message shows it: repr, control characters escaped, long values cut; a
    container by its size only (its repr may be huge: a YAML alias bomb)."""
    if isinstance(value, (list, tuple, dict, set)):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, str) and len(value) > 80:
        value = value[:80]
    text = repr(value) if not isinstance(value, (int, float)) or isinstance(value, bool) else str(value)
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= 80 else text[:77] + "..."


# -- scalars --------------------------------------------------------------------------------------
def integer(value, what: str, lo: int = 1, hi: int | None = None, fix: str = "") -> int:
    """``value`` as an int in [lo, hi]; a bool, a float or a string is refused.

    Args:
        what: where the value comes from (``--tp``, ``config.json: num_hidden_layers``).
        fix: appended to the message (``"; use ..."``).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "a string" if isinstance(value, str) else type(value).__name__
        raise PlanError(f"{what} must be an integer, got {_show(value)} ({kind}){fix}")
    if value < lo:
        rule = "a positive integer" if lo == 1 else f">= {lo}"
        raise PlanError(f"{what} must be {rule}, got {value}{fix}")
    if hi is not None and value > hi:
        raise PlanError(f"{what} is {value:,}, above the limit of {hi:,}{fix or '; give a smaller value'}")
    return value


def number(value, what: str, hi: float, positive: bool = True, fix: str = "") -> float:
    """``value`` as a finite float in (0, hi] (or [0, hi] when not ``positive``)."""
    rule = "a positive number" if positive else "a number >= 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        quotes = " (a string: write the number without quotes)" if isinstance(value, str) else ""
        raise PlanError(f"{what} must be {rule}, got {_show(value)}{quotes}{fix}")
    value = float(value)
    if not math.isfinite(value):
        raise PlanError(f"{what} must be a finite number, got {value}{fix}")
    if value < 0 or (positive and value == 0):
        raise PlanError(f"{what} must be {rule}, got {value:g}{fix}")
    if value > hi:
        raise PlanError(f"{what} is {value:g}, above the limit of {hi:g}{fix or '; check the unit'}")
    return value


def boolean(value, what: str) -> bool:
    """A real boolean; ``"false"`` (a string) is refused rather than read as true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        raise PlanError(f"{what} is the string {value!r}, not a boolean; write {value.strip().lower()} without quotes")
    raise PlanError(f"{what} must be true or false, got {_show(value)}")


def name(value, what: str, identifier: bool = False) -> str:
    """A non-empty name of at most MAX_NAME characters; an ``identifier`` is letters, digits, _ or -."""
    if not isinstance(value, str) or not value.strip():
        raise PlanError(f"{what} must be a non-empty string, got {_show(value)}")
    if len(value) > MAX_NAME:
        raise PlanError(f"{what} is {len(value)} characters long, above the limit of {MAX_NAME}; shorten it")
    if identifier and not _IDENTIFIER.fullmatch(value):
        raise PlanError(f"{what} must be a short identifier (a letter, then letters, digits, _ or -; at most 64), "
                        f"got {_show(value)}")
    return value


# -- files ----------------------------------------------------------------------------------------
def read_text(path, what: str, missing_hint: str = "") -> str:
    """The UTF-8 text of a regular file of at most MAX_FILE_BYTES (no directory, device or pipe)."""
    if str(path).strip() == "":
        raise PlanError(f"{what}: the path is empty; give a file name")
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise PlanError(f"{what} {path} does not exist{missing_hint}") from None
    except OSError as exc:
        raise PlanError(f"{what} {path}: cannot read it ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise PlanError(f"{what} {path} is a directory; give a file")
    if not stat.S_ISREG(st.st_mode):
        raise PlanError(f"{what} {path} is not a regular file (a device or a pipe); give a file")
    if st.st_size > MAX_FILE_BYTES:
        raise PlanError(f"{what} {path} is {st.st_size:,} bytes, above the limit of {MAX_FILE_BYTES:,}")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)  # files like /proc/* report size 0
    except OSError as exc:
        raise PlanError(f"{what} {path}: cannot read it ({exc.strerror})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise PlanError(f"{what} {path} is larger than the limit of {MAX_FILE_BYTES:,} bytes")
    if b"\0" in raw:
        raise PlanError(f"{what} {path} is a binary file, not JSON or YAML text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PlanError(f"{what} {path} is not UTF-8 text (a binary file?)") from None


def read_json(path, what: str, missing_hint: str = ""):
    """The JSON in ``path`` (read by ``read_text``); NaN and Infinity parse, and the typed checks of
    the values that are used refuse them."""
    text = read_text(path, what, missing_hint)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"{what} {path}: not valid JSON, cannot parse ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise PlanError(f"{what} {path}: nested too deeply to be a config") from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise PlanError(f"{what} {path}: not valid JSON, cannot parse ({str(exc).splitlines()[0]})") from None


def _expanded_size(node, memo: dict) -> int:
    """Nodes of a YAML node graph once every alias is expanded (each shared node counted once per use)."""
    key = id(node)
    if key not in memo:
        memo[key] = 0  # a recursive alias counts as nothing more
        children = node.value if isinstance(node.value, list) else ()
        items = [x for pair in children for x in pair] if children and isinstance(children[0], tuple) else children
        memo[key] = 1 + sum(_expanded_size(child, memo) for child in items)
        if memo[key] > MAX_YAML_NODES:
            raise PlanError(f"its aliases (*name) expand to more than {MAX_YAML_NODES:,} values; write the values "
                            "out instead")
    return memo[key]


def _yaml_loader():
    """A SafeLoader that refuses documents whose aliases expand beyond MAX_YAML_NODES nodes (a
    600-byte alias bomb expands to gigabytes once anything walks it)."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def compose_document(self):
            node = super().compose_document()
            _expanded_size(node, {})
            return node

    return BoundedLoader


def read_mapping(path, what: str):
    """A YAML (``.yaml``, ``.yml``) or JSON file's content, read by ``read_text``."""
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        return read_json(path, what)
    import yaml

    text = read_text(path, what)
    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except PlanError as exc:
        raise PlanError(f"{what} {path}: {exc}") from None
    except RecursionError:
        raise PlanError(f"{what} {path}: nested too deeply to be a config") from None
    except Exception as exc:  # noqa: BLE001 - any parse error becomes one line
        raise PlanError(f"{what} {path}: cannot parse ({str(exc).splitlines()[0]})") from None


# -- Hugging Face config.json ---------------------------------------------------------------------
# key -> (the ModelConfig field it sets, kind, upper bound); "int0" allows 0 and null (a default),
# "int?" allows null
_HF_KEYS = {
    "num_hidden_layers": ("layers", "int", MAX_LAYERS), "n_layer": ("layers", "int", MAX_LAYERS),
    "hidden_size": ("hidden", "int", MAX_WIDTH), "n_embd": ("hidden", "int", MAX_WIDTH),
    "num_attention_heads": ("heads", "int", MAX_HEADS), "n_head": ("heads", "int", MAX_HEADS),
    "num_key_value_heads": ("kv_heads", "int?", MAX_HEADS), "head_dim": ("head_dim", "int0", MAX_WIDTH),
    "intermediate_size": ("ffn", "int", MAX_WIDTH), "n_inner": ("ffn", "int0", MAX_WIDTH),
    "vocab_size": ("vocab", "int", MAX_VOCAB), "max_position_embeddings": ("max_context", "int", MAX_CONTEXT),
    "n_positions": ("max_context", "int", MAX_CONTEXT), "num_local_experts": ("experts", "int0", MAX_EXPERTS),
    "num_experts_per_tok": ("top_k", "int", MAX_EXPERTS),
    "tie_word_embeddings": ("tied", "bool", None), "attention_bias": ("qkv_bias", "bool", None),
    "hidden_act": ("mlp", "str", None), "model_type": ("family", "str", None),
}


def hf_config(data, path) -> dict:
    """Check the types and ranges of the config.json keys the model builders read."""
    if not isinstance(data, dict):
        raise PlanError(f"{path}: expected a JSON object of config keys, got {type(data).__name__}")
    for key, (field, kind, hi) in _HF_KEYS.items():
        if key not in data:
            continue
        value, where = data[key], f"{path}: key {key}" + (f": {field}" if kind.startswith("int") else "")
        if kind == "bool":
            boolean(value, where)
        elif kind == "str":
            name(value, where)
        elif not (kind != "int" and value is None):
            integer(value, where, lo=0 if kind == "int0" else 1, hi=hi)
    return data


# -- ModelConfig ----------------------------------------------------------------------------------
_MODEL_BOUNDS = {"layers": (1, MAX_LAYERS), "hidden": (1, MAX_WIDTH), "heads": (1, MAX_HEADS),
                 "kv_heads": (0, MAX_HEADS), "head_dim": (0, MAX_WIDTH), "ffn": (1, MAX_WIDTH),
                 "vocab": (1, MAX_VOCAB), "max_context": (1, MAX_CONTEXT), "experts": (1, MAX_EXPERTS),
                 "top_k": (1, MAX_EXPERTS), "moe_ffn": (0, MAX_WIDTH), "dense_layers": (0, MAX_LAYERS),
                 "lora_rank": (0, MAX_WIDTH)}


def model_config(cfg) -> None:
    """Every field of a ModelConfig with its type and range (called when one is built)."""
    name(cfg.name, "model name")
    where = f"model {cfg.name}"
    for f in dataclasses.fields(cfg):
        value, what = getattr(cfg, f.name), f"{where}: {f.name}"
        if f.name in _MODEL_BOUNDS:
            lo, hi = _MODEL_BOUNDS[f.name]
            integer(value, what, lo=lo, hi=hi)
        elif f.type == "bool":
            boolean(value, what)
        elif f.type == "float":
            number(value, what, hi=MAX_CAPACITY_FACTOR)
        elif f.type == "str" and f.name not in ("name", "source"):
            name(value, what)
    if not isinstance(cfg.lora_targets, tuple) or not all(isinstance(t, str) for t in cfg.lora_targets):
        raise PlanError(f"{where}: lora_targets must be a list of projection names (q, k, v, o, ...), got "
                        f"{_show(cfg.lora_targets)}")


# -- mappings and dataclasses ---------------------------------------------------------------------
def keys(data, where: str, required: tuple, optional: tuple = (), fix: str = "") -> dict:
    """A mapping with every ``required`` key and no key outside ``required + optional``."""
    if not isinstance(data, dict):
        raise PlanError(f"{where}: expected a mapping, got {_show(data)}")
    missing = [k for k in required if k not in data]
    if missing:
        raise PlanError(f"{where}: missing key(s) {', '.join(missing)}{fix}")
    unknown = sorted(set(data) - set(required) - set(optional), key=str)
    if unknown:
        raise PlanError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(required + optional)}")
    return data


def same_model(planned, given, where: str) -> None:
    """A plan's model against the model of the command line: every dimension, not only the name."""
    diff = [f"{f.name} {getattr(planned, f.name)!r} vs {getattr(given, f.name)!r}"
            for f in dataclasses.fields(planned)
            if f.compare and getattr(planned, f.name) != getattr(given, f.name)]
    if diff:
        raise PlanError(f"{where} is for another model than {given.name}: {'; '.join(diff[:4])}; plan this model "
                        "with symtensor plan ... --out, or give the plan's model")


# -- command-line options -------------------------------------------------------------------------
# option dest -> upper bound; every one must be a positive integer
_CLI_SIZES = {"seq": MAX_SEQ, "global_batch": MAX_BATCH, "nodes": MAX_DEVICES, "devices": MAX_DEVICES,
              "tp": MAX_DEVICES, "pp": MAX_DEVICES, "cp": MAX_DEVICES, "ep": MAX_DEVICES, "etp": MAX_DEVICES,
              "dp": MAX_DEVICES,
              "vpp": MAX_LAYERS, "steps": MAX_STEPS}
_SWEEP_SIZES = ("seq", "devices", "nodes", "global_batch")


def parse_range(text, flag: str) -> list[int] | None:
    """``"2048..131072"`` -> [2048, 4096, ..., 131072]; ``"8..64:4"`` -> [8, 32]; ``"1,3,9"``; ``"512"``.

    >>> parse_range("2048..16384", "--seq")
    [2048, 4096, 8192, 16384]
    """
    if text is None:
        return None
    if isinstance(text, int):
        return [text]
    if isinstance(text, (list, tuple)):
        return [int(v) for v in text]
    text = str(text).strip()
    try:
        if ".." in text:
            lo, _, rest = text.partition("..")
            hi, _, step = rest.partition(":")
            lo, hi, factor = int(lo), int(hi), int(step or 2)
            if lo <= 0 or hi < lo or factor < 2:
                raise ValueError
            out = [lo]
            while out[-1] * factor <= hi:
                out.append(out[-1] * factor)
            return out
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PlanError(f"{flag} {text}: expected N, A..B (doubling), A..B:F (times F) or A,B,C with "
                        "positive integers and A <= B") from None
    if not values or min(values) <= 0:
        raise PlanError(f"{flag} {text}: values must be positive integers")
    return values


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def cli_args(args) -> None:
    """Check (and normalise) the options of one parsed command line; a PlanError names the option."""
    command = args.command
    labels = {"model": "MODEL", "a": "A", "b": "B", "cluster": "--cluster",
              "plan": "--plan" if command == "run" else "PLAN"}
    for dest, label in labels.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.strip():
            raise PlanError(f"{label}: the value is empty; give a preset name or a file")
    if command == "sweep":
        _sweep_args(args)
    if command == "report" and args.sweep not in (None, "none"):
        _report_sweep(args.sweep)
    for dest, hi in _CLI_SIZES.items():
        value = getattr(args, dest, None)
        if value is not None and not (command == "sweep" and dest in _SWEEP_SIZES):
            integer(value, _flag(dest), hi=hi)
    spec = getattr(args, "torch", None)
    if spec is not None and not re.fullmatch(r"[\w.]+:\w+", spec):
        raise PlanError(f"--torch {spec}: expected package.module:factory, a function that returns (the module, "
                        "example inputs)")
    mb = getattr(args, "micro_batch", None)
    if mb not in (None, "auto"):
        integer(mb, "--micro-batch", hi=MAX_BATCH, fix="; give a positive integer or auto")
    if command == "run":
        _run_args(args)
    from symtensor.output import target

    for dest in ("out", "html"):
        if getattr(args, dest, None) is not None:
            setattr(args, dest, str(target(getattr(args, dest), _flag(dest), force=getattr(args, "force", False))))


def _run_args(args) -> None:
    integer(args.devices, "--devices", hi=MAX_RUN_PROCESSES, fix=f"; run starts one CPU process per device "
                                                               f"(at most {MAX_RUN_PROCESSES})")
    if args.timeout is not None:
        number(args.timeout, "--timeout", MAX_TIMEOUT_S, fix="; give seconds, e.g. --timeout 300")
    if args.master_port is not None:
        integer(args.master_port, "--master-port", hi=65535, fix="; give a free TCP port, or omit it")


def _report_sweep(spec: str) -> None:
    """``report --sweep PARAM=RANGE`` checked before the plan search that precedes the sweep."""
    param, _, rng = spec.partition("=")
    if param not in _SWEEP_SIZES or not rng:
        raise PlanError(f"--sweep {spec}: expected PARAM=RANGE with PARAM one of {', '.join(_SWEEP_SIZES)} "
                        "(e.g. seq=2048..32768), or none")
    values = parse_range(rng, f"--sweep {param}")
    if len(values) > MAX_SWEEP_POINTS:
        raise PlanError(f"--sweep {spec}: {len(values)} points, above the limit of {MAX_SWEEP_POINTS}")
    for v in values:
        integer(v, f"--sweep {param}", hi=_CLI_SIZES[param])


def _sweep_args(args) -> None:
    for dest in _SWEEP_SIZES:
        values = parse_range(getattr(args, dest, None), _flag(dest))
        if values is None:
            continue
        if len(values) > MAX_SWEEP_POINTS:
            raise PlanError(f"{_flag(dest)}: {len(values)} points, above the limit of {MAX_SWEEP_POINTS}; "
                            "use a coarser range (A..B:F) or fewer values")
        for v in values:
            integer(v, _flag(dest), hi=_CLI_SIZES[dest])
