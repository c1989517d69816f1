"""Go's number formatting, so templated annotations read exactly as Prometheus writes them."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any


def _special(v: float) -> str | None:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return None


def go_float(v: float) -> str:
    """``fmt.Sprint(float64)``: shortest round-trip digits, %e when exp < -4 or >= 6.

    Go's %v on a float64 is strconv's 'g' with precision -1, which switches to
    exponent form at the same thresholds as %g with precision 6.
    """
    s = _special(v)
    if s is not None:
        return s
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    sign, digits, exp = Decimal(repr(v)).as_tuple()
    ds = list(digits)
    assert isinstance(exp, int)
    while len(ds) > 1 and ds[-1] == 0:
        ds.pop()
        exp += 1
    nd = len(ds)
    dp = nd + exp
    x = dp - 1
    neg = "-" if sign else ""
    text = "".join(str(d) for d in ds)
    if x < -4 or x >= EPREC_SHORTEST:
        mant = text[0] + ("." + text[1:] if nd > 1 else "")
        return f"{neg}{mant}e{'-' if x < 0 else '+'}{abs(x):02d}"
    if dp <= 0:
        return f"{neg}0.{'0' * -dp}{text}"
    if dp >= nd:
        return f"{neg}{text}{'0' * (dp - nd)}"
    return f"{neg}{text[:dp]}.{text[dp:]}"


EPREC_SHORTEST = 6

_VERB = re.compile(r"%([-+# 0]*)(\d+)?(?:\.(\d+))?([a-zA-Z%])")
# A width or precision above this is formatted as this: its output would be cut by the
# template output bound (templates.py, 64 KiB) anyway, and ``%999999999d`` took 2.4 GB.
MAX_WIDTH = 64 * 1024


def _go_overflows(digits: str | None) -> bool:
    """Go's fmt.parsenum gives up on a width or precision once past 1e6 with digits left."""
    num = 0
    for ch in digits or "":
        if num > 1_000_000:
            return True
        num = num * 10 + ord(ch) - 48
    return False


def _capped(digits: str | None) -> str | None:
    if digits is None or len(digits) <= 5:
        return digits
    return str(MAX_WIDTH) if len(digits) > 6 or int(digits) > MAX_WIDTH else digits


def go_sprintf(fmt: str, args: list[Any], limit: int | None = None) -> str:
    """A subset of Go's fmt.Sprintf: verbs v s d f F e E g G q x and %%.

    A width or precision Go's parser gives up on (over 1e6 with digits left)
    ends the format as in Go, with ``%!(NOVERB)``; the others are capped at
    :data:`MAX_WIDTH`. ``limit``
    (characters): formatting stops once the text is longer, and what is made
    so far (more than ``limit``) is returned, for the caller to cut.
    """
    out = []
    pos = 0
    i = 0
    size = 0
    for m in _VERB.finditer(fmt):
        out.append(fmt[pos : m.start()])
        pos = m.end()
        flags, width, prec, verb = m.groups()
        if _go_overflows(width) or _go_overflows(prec):
            out.append("%!(NOVERB)")
            pos = len(fmt)
            break
        if verb == "%":
            out.append("%")
            continue
        if i >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        arg = args[i]
        i += 1
        out.append(_one(flags, _capped(width), _capped(prec), verb, arg))
        size += len(out[-2]) + len(out[-1])
        if limit is not None and size > limit:
            return "".join(out)
    out.append(fmt[pos:])
    if i < len(args):
        extra = ", ".join(f"{_go_type(a)}={go_value(a)}" for a in args[i:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def _one(flags: str, width: str | None, prec: str | None, verb: str, arg: Any) -> str:
    spec = "%" + flags + (width or "") + (f".{prec}" if prec is not None else "")
    if isinstance(arg, bool):
        arg = str(arg).lower()
    if verb in "vs":
        text = go_value(arg)
        return (spec + "s") % text
    if verb == "q":
        return '"' + str(arg).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(arg, str):
        return f"%!{verb}(string={arg})"
    if verb == "d":
        if isinstance(arg, int):
            return (spec + "d") % arg
        return f"%!d(float64={go_value(arg)})"
    if verb in "feEgGF":
        v = float(arg)
        s = _special(v)
        if s is not None:
            return ((spec.replace("0", "") if "0" in flags else spec) + "s") % s
        if verb in "gG" and prec is None:
            return (spec + "s") % go_float(v)
        return (spec + ("f" if verb == "F" else verb)) % v
    if verb == "x" and isinstance(arg, int):
        return (spec + "x") % arg
    return f"%!{verb}({type(arg).__name__}={go_value(arg)})"


def _go_type(v: Any) -> str:
    """The Go type a template value has, as fmt names it in ``%!(EXTRA ...)``."""
    return {float: "float64", str: "string"}.get(type(v), type(v).__name__)


def go_value(v: Any) -> str:
    if isinstance(v, float):
        return go_float(v)
    if isinstance(v, dict):
        inner = " ".join(f"{k}:{v[k]}" for k in sorted(v))
        return f"map[{inner}]"
    return str(v)


def go_g4(v: float) -> str:
    """``fmt.Sprintf("%.4g", v)``."""
    s = _special(v)
    if s is not None:
        return s
    return f"{v:.4g}"
