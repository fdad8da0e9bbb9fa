#!/usr/bin/env python3
"""Generate BFCL v4 non-live test answers for parity checks.

Our own script (no code from the `bfcl-eval` wheel): it reads the wheel's
data files and writes JSON Lines answers in the input format of
`bfcl_official_check.py`, so one file feeds both the official checker and
`sala bfcl`'s (Rust) decoder + checker, and their verdicts can be compared
line by line.  See /work/notes/bfcl.md for the rules being exercised.

Usage:

    python3 tests/reference/bfcl_perturb.py WHEEL_OR_DATA_DIR [--fc] [--seed N] > answers.jsonl

WHEEL_OR_DATA_DIR is the unpacked wheel (containing bfcl_eval/data) or the
data directory itself.  Output lines:

    {"id", "category", "variant", "raw": "<prompt-mode model text>"}   every category
    {"id", "category", "variant", "decoded": [{name: {arg: value}}]}  java / javascript too (values
                                                                      are the source-text strings
                                                                      the tree-sitter decoder yields)

Per entry: renderings of the ground truth (which should pass) in several
syntactic styles, and systematic perturbations (wrong value, wrong type,
missing required / extra / omitted optional parameters, wrong function name,
dropped / extra / reordered calls, string standardisation variants, nested
list element types, dict keys and values, decoding edge cases).  Every
eighth simple_python entry also gets "stress" lines: its call with one
value replaced by each of ~120 tricky Python expressions, and ~40 odd
overall layouts.  Java/JavaScript entries get raw replies too, for BFCL's
tree-sitter decoders: the ground truth as Java/JavaScript source
(`new int[]{...}`, `new ArrayList<>(Arrays.asList(...))`, anonymous-class
HashMaps, quoted strings, arrays, objects), the same perturbations, and
syntax slips (lost brackets, `:` for `=`, stray commas, prose, quotes...);
every fourth entry also gets ~120 tricky values (escapes, non-ASCII text,
odd literals, lambdas, casts, comments, malformed ones), ~45 layouts of its
call, and nesting on both sides of where BFCL's recursive Java decoder hits
Python's recursion limit.  For irrelevance: prose, empty lists, calls.

--fc writes "decoded" lines for every category as an FC model with
`underscore_to_dot` would return them (dots in names replaced by `_`, plus
some with the dots kept): check them with `--underscore-to-dot`.

Everything is deterministic: each entry's choices come from a random
generator seeded with the seed and the entry id.
"""

import argparse
import json
import os
import random
import re
import zlib

CATEGORIES = [
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
]


def load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def data_dir(path):
    nested = os.path.join(path, "bfcl_eval", "data")
    return nested if os.path.isdir(nested) else path


# ------------------------------------------------------------------ ground truth


def first_alternative(alternatives):
    """The first alternative that is not "" (None if the param is optional-only)."""
    for a in alternatives:
        if a != "":
            return a
    return None


def choose(rng, alternatives):
    options = [a for a in alternatives if a != ""]
    return rng.choice(options) if options else None


def concrete(value, rng=None):
    """A concrete value from an alternative: dict alternatives map keys to
    their own alternative lists; lists of dicts likewise."""
    pick = (lambda alts: choose(rng, alts)) if rng else first_alternative
    if isinstance(value, dict):
        out = {}
        for k, alts in value.items():
            if not isinstance(alts, list):
                # The bare-string quirk (simple_java_64): keep it as is.
                out[k] = alts
                continue
            v = pick(alts)
            if v is not None:
                out[k] = concrete(v, rng)
        return out
    if isinstance(value, list):
        return [concrete(v, rng) if isinstance(v, dict) else v for v in value]
    return value


def gt_calls(entry, rng=None):
    """[(name, {param: value})] for one rendering of the ground truth."""
    calls = []
    for call in entry["ground_truth"]:
        (name, params), = call.items()
        args = {}
        for p, alts in params.items():
            v = choose(rng, alts) if rng else first_alternative(alts)
            if v is not None:
                args[p] = concrete(v, rng)
        calls.append((name, args))
    return calls


def doc_by_name(entry, name):
    for f in entry["function"]:
        if f["name"] == name:
            return f
    return None


# ------------------------------------------------------------------ python source


def py_str(s, style):
    if style == "double" and all(ord(c) < 128 for c in s):
        return json.dumps(s)
    if style == "triple" and "'''" not in s and not s.endswith("'") and "\\" not in s:
        return "'''" + s + "'''"
    return repr(s)


def py_src(v, style="repr", tuple_params=False):
    if isinstance(v, str):
        return py_str(v, style)
    if isinstance(v, bool) or v is None:
        return repr(v)
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, tuple):
        inner = ", ".join(py_src(x, style) for x in v)
        return "(" + inner + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, list):
        inner = ", ".join(py_src(x, style) for x in v)
        return "(" + inner + ("," if len(v) == 1 else "") + ")" if tuple_params else "[" + inner + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(py_src(k, style) + ": " + py_src(x, style) for k, x in v.items()) + "}"
    raise TypeError(type(v))


class Raw:
    """An argument given as Python source text rather than a value."""

    def __init__(self, text):
        self.text = text


def render_args(args, style="repr", sep=", ", eq="=", tuple_params=()):
    parts = []
    for k, v in args.items():
        if k is None:
            parts.append(v.text)
        elif isinstance(v, Raw):
            parts.append(f"{k}{eq}{v.text}")
        else:
            parts.append(f"{k}{eq}{py_src(v, style, k in tuple_params)}")
    return sep.join(parts)


def render_calls(calls, style="repr", sep=", ", eq="=", wrap="list", tuple_params=()):
    body = ", ".join(f"{n}({render_args(a, style, sep, eq, tuple_params)})" for n, a in calls)
    if wrap == "list":
        return "[" + body + "]"
    if wrap == "bare":
        return body
    if wrap == "fence":
        return "```\n[" + body + "]\n```"
    if wrap == "padded":
        return "  \n[" + body + "] \n"
    raise ValueError(wrap)


# ------------------------------------------------------------------ perturbations


def param_types(entry, name):
    doc = doc_by_name(entry, name)
    return {p: s.get("type") for p, s in doc["parameters"]["properties"].items()} if doc else {}


def wrong_value(v, rng):
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + rng.choice([1, 7, 100])
    if isinstance(v, float):
        return v * 2 + 1.5
    if isinstance(v, str):
        return v + "zq"
    if isinstance(v, list):
        return v + [v[0]] if v else ["zq"]
    if isinstance(v, dict):
        if not v:
            return {"zq": 1}
        k = rng.choice(list(v))
        return {**v, k: wrong_value(v[k], rng)}
    return "zq"


def wrong_type(v, rng):
    """A value of another type, sometimes equal under Python ==."""
    if isinstance(v, bool):
        return rng.choice([int(v), str(v).lower(), "True"])
    if isinstance(v, int):
        return rng.choice([float(v), str(v), [v]])
    if isinstance(v, float):
        return rng.choice([int(v), str(v), round(v) if v == int(v) else int(v)])
    if isinstance(v, str):
        return rng.choice([len(v), [v], None, True])
    if isinstance(v, list):
        return rng.choice([tuple(v), {"items": v}, ",".join(map(str, v))])
    if isinstance(v, dict):
        return rng.choice([list(v.values()), json.dumps(v)])
    return 0


def string_variant(s, rng):
    """Variants that standardize_string maps to the same text (mostly)."""
    choices = [
        s.upper(),
        s.lower(),
        s.replace(" ", ""),
        s.replace(" ", "_"),
        s + ".",
        " - ".join(s.split(" ")),
        s.replace("'", '"'),
        s.replace("-", "/"),
        s.title(),
        s + "!",  # not standardized away: should fail
    ]
    return rng.choice(choices)


def nested_variant(v, rng):
    if not isinstance(v, list) or not v:
        return None
    x = v[0]
    if isinstance(x, bool):
        return [int(e) for e in v]
    if isinstance(x, float):
        return [int(e) if e == int(e) else e for e in v]
    if isinstance(x, int):
        return [float(e) for e in v]
    if isinstance(x, str):
        return rng.choice([[len(e) for e in v], [e.upper() for e in v], list(reversed(v)), v[:-1]])
    if isinstance(x, dict):
        return rng.choice([v[:-1], v + [v[0]], [dict(list(e.items())[:-1]) for e in v]])
    if isinstance(x, list):
        return [[float(e) if isinstance(e, int) else e for e in row] for row in v]
    return None


def dict_variant(v, rng):
    if not isinstance(v, dict) or not v:
        return None
    k = rng.choice(list(v))
    kind = rng.choice(["rename", "drop", "value", "upper", "extra"])
    if kind == "rename":
        return {(kk + "_x" if kk == k else kk): vv for kk, vv in v.items()}
    if kind == "drop":
        return {kk: vv for kk, vv in v.items() if kk != k}
    if kind == "value":
        return {**v, k: wrong_value(v[k], rng)}
    if kind == "upper":
        return {kk: (vv.upper() if isinstance(vv, str) else vv) for kk, vv in v.items()}
    return {**v, "zq_extra": 1}


def expression_form(v, rng):
    """Python source that BFCL's decoder resolves to v (or nearly)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return rng.choice([f"{v - 3} + 3", f"({v}) * 1", f"{v * 2} // 2", f"-{-v}" if v < 0 else f"+{v}"])
    if isinstance(v, float):
        return rng.choice([f"{v!r} * 1", f"{v * 2!r} / 2", f"-{-v!r}" if v < 0 else f"+{v!r}"])
    if isinstance(v, str):
        if v.isidentifier() and v not in ("True", "False", "None", "not", "and", "or", "in", "is", "if", "else", "for", "lambda"):
            return v  # bare name: decodes to the string
        if len(v) > 1:
            i = len(v) // 2
            return f"{v[:i]!r} + {v[i:]!r}"
    if isinstance(v, list) and v and all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in v):
        return f"{py_src(v)} + []"
    return None


def python_variants(entry, rng):
    """(variant, raw text) pairs for a python-category entry."""
    gt = entry["ground_truth"]
    calls = gt_calls(entry)
    out = [("gt", render_calls(calls))]
    tuple_params = {p for n, _ in calls for p, t in param_types(entry, n).items() if t == "tuple"}

    style = rng.choice(["repr", "double", "triple"])
    alt_calls = gt_calls(entry, rng)
    out.append(("gt_alt_style", render_calls(alt_calls, style, rng.choice([", ", ",", " , "]), rng.choice(["=", " = "]),
                                               rng.choice(["list", "bare", "fence", "padded"]), tuple_params)))
    if tuple_params:
        out.append(("gt_tuple", render_calls(calls, tuple_params=tuple_params)))

    # Omit every optional ("" allowed) parameter.
    omitted = []
    for (name, args), call in zip(calls, gt):
        params = call[name]
        omitted.append((name, {k: v for k, v in args.items() if "" not in params.get(k, [])}))
    if omitted != calls:
        out.append(("omit_optional", render_calls(omitted)))

    ci = rng.randrange(len(calls))
    name, args = calls[ci]
    doc = doc_by_name(entry, name)
    required = doc["parameters"]["required"] if doc else []

    def with_call(new_name, new_args):
        cs = list(calls)
        cs[ci] = (new_name, new_args)
        return render_calls(cs)

    if args:
        p = rng.choice(list(args))
        out.append(("wrong_value", with_call(name, {**args, p: wrong_value(args[p], rng)})))
        p = rng.choice(list(args))
        out.append(("wrong_type", with_call(name, {**args, p: wrong_type(args[p], rng)})))
        p = rng.choice(list(args))
        expr = expression_form(args[p], rng)
        if expr is not None:
            out.append(("expression", with_call(name, {**args, p: Raw(expr)})))
        strs = [k for k, v in args.items() if isinstance(v, str)]
        if strs:
            p = rng.choice(strs)
            out.append(("string_variant", with_call(name, {**args, p: string_variant(args[p], rng)})))
        # (A throwaway generator: only whether a variant exists matters here.)
        lists = [k for k, v in args.items() if nested_variant(v, random.Random(0)) is not None]
        if lists:
            p = rng.choice(lists)
            out.append(("nested", with_call(name, {**args, p: nested_variant(args[p], rng)})))
        # Every dict argument gets several key/value changes (dicts are rare).
        for p in [k for k, v in args.items() if isinstance(v, dict) and v]:
            for _ in range(4):
                out.append(("dict", with_call(name, {**args, p: dict_variant(args[p], rng)})))
        for p in [k for k, v in args.items() if isinstance(v, list) and v and isinstance(v[0], dict)]:
            for _ in range(4):
                out.append(("list_dict", with_call(name, {**args, p: nested_variant(args[p], rng)})))
        # Positional arguments are dropped by the decoder.
        out.append(("positional", with_call(name, {None: Raw(py_src(rng.choice(list(args.values())))), **args})))
        # Reordered keywords, repeated keyword (last wins), **kwargs.
        keys = list(args)
        rng.shuffle(keys)
        out.append(("reordered_args", with_call(name, {k: args[k] for k in keys})))
        p = rng.choice(list(args))
        dup = render_args(args) + f", {p}={py_src(wrong_value(args[p], rng))}, {p}={py_src(args[p])}"
        cs = [f"{n}({render_args(a)})" for n, a in calls]
        cs[ci] = f"{name}({dup})"
        out.append(("repeated_keyword", "[" + ", ".join(cs) + "]"))
        cs[ci] = f"{name}({render_args(args)}, **extra)"
        out.append(("double_star", "[" + ", ".join(cs) + "]"))
        # Call and subscript values become text.
        p = rng.choice(list(args))
        out.append(("call_value", with_call(name, {**args, p: Raw(rng.choice(["np.array([1,2])", "str( 5 )", "datetime.now()", "x[0]", "data['k']", "float('nan')"]))})))
    req_present = [r for r in required if r in args]
    if req_present:
        p = rng.choice(req_present)
        out.append(("missing_required", with_call(name, {k: v for k, v in args.items() if k != p})))
    out.append(("extra_param", with_call(name, {**args, "zq_unexpected": rng.choice([1, "x", True])})))
    # A ground-truth param that is neither required nor optional, omitted.
    params = gt[ci][name]
    must = [p for p in args if p not in required and "" not in params.get(p, [""])]
    if must:
        p = rng.choice(must)
        out.append(("omit_gt_param", with_call(name, {k: v for k, v in args.items() if k != p})))
    props = list(doc["parameters"]["properties"]) if doc else []
    absent = [p for p in props if p not in args]
    if absent:
        p = rng.choice(absent)
        # A doc param missing from the ground truth (or optional there).
        out.append(("doc_param_not_in_gt", with_call(name, {**args, p: args.get(p, 1)})))
    out.append(("wrong_name", with_call(name + rng.choice(["_v2", "x", "_x"]), args)))
    out.append(("name_case", with_call(name.upper(), args)))

    # Call-level changes.
    if len(calls) > 1:
        out.append(("drop_call", render_calls(calls[:-1])))
        out.append(("reversed_calls", render_calls(list(reversed(calls)))))
        shuffled = list(calls)
        rng.shuffle(shuffled)
        out.append(("shuffled_calls", render_calls(shuffled)))
    out.append(("extra_call", render_calls(calls + [calls[ci]])))
    others = [f["name"] for f in entry["function"] if f["name"] != name]
    if others:
        other = rng.choice(others)
        out.append(("other_function", with_call(other, args)))
    out.append(("empty", rng.choice(["[]", "", "``` ```"])))

    # Decoding edge cases.
    text = render_calls(calls)
    out.append(("decode_edge", rng.choice([
        "```python\n" + text + "\n```",
        text + " I hope this helps.",
        "'" + text + "'",
        text[:-2],
        "Sure! " + text,
        text.replace("(", " (", 1),
        text + "\n",
        text.replace("=", ":", 1),
        "[" + text + "]",
        text[1:-1] + ";",
    ])))
    return out


# Python expressions exercising the decoder's corner cases (resolution
# rules, literal forms, unparse normalisation, things that must fail).
STRESS_VALUES = [
    "+5", "-5", "not 5", "~5", "-5.5", "--5", "-(5)", "-'a'", "-True", "-None", "-x",
    "5 + 3", "2 ** 10", "7 // 2", "7 / 2", "-7 % 3", "2 ** -1", "7.5 // 2", "-7.5 % 2", "1 / 0", "2 ** 0.5",
    "True + 1", "1e3", "1_000", "0x1F", "0o17", "0b101", "1.", ".5", "5j", "1e400", "0_0", "00", "01",
    "'a' 'b'", '"a" + \'b\'', "'ab' * 2", "3 * [1]", "u'x'", r"r'\d'", "b'x'", "'''tri'''", r"'\x41\n'",
    r"'\u00e9'", r"'\q'", r"'\101'", "f'x{y}'", "'é'", "'日本'", r"'it\'s'", r'"say \"hi\""',
    "[1, 2][0]", "a[1:2]", "a[::2]", "a[1, 2]", "d['k']", "a[b][c]", "(a + b)[0]", "x[-1]",
    "np.array([1,2])", "f()", "g(1, 'a')", "g(*a)", "g(1, k=2)", "g(k=[1, -2])", "a.b()", "a.b.c(1, 2.0, None)",
    "g(1 + 2, x if y else z)", "g(lambda x: x)", "g(a < b, not c)", "g({1: 'a'}, {2, 3}, (4,), ())",
    "g(-x ** 2, (-x) ** 2, a or b and c)", "str( 5 )", "h(**kw)", "g(a)(b)",
    "a.b", "{1, 2}", "[x for x in y]", "lambda: 1", "1 if a else 2", "a < b", "a and b", "(a := 1)",
    "[*a]", "{**a}", "{1: 2, 1.0: 3, True: 4}", "{[1]: 2}", "(1,)", "()", "[]", "{}", "None",
    "True", "...", "x", "true", "null", "[1, -2, +3]", "(1, 'a', [2])", "{'a': -1, 'b': [1.5]}",
    "[1, 2] + [3]", "(1,) + (2,)", "[[1, 2], [3, 4]]", "[1.0, 2.0]", "[1, 2.0, True]", "{'k': 'v'}",
    "2 ** 3 ** 2", "-2 ** 2", "(1 + 2) * 3", "10 - 2 - 3", "1 << 3", "6 & 3", "6 | 3 ^ 1",
    "'a' # comment\n", "(\n 1\n)", "1 +\\\n 2", "\t5",
]

STRESS_TEXTS = [
    "f(x=1)", "(f(x=1), g(y=2))", "[f(x=1)]\n[g(y=2)]", "[f(x=1),]", "[f(x=1)][0]", "[*f(x=1)]", "{f(x=1)}",
    "[f(x=1, 2)]", "[f(x=1, *a)]", "[f(**k, x=1)]", "[f(**k, *a)]", "[f(x for x in y)]", "[f(名前=1)]",
    "[f(True=1)]", "[f(a.b=1)]", "[a.b.c.d(x=1)]", "[x[0].f(y=1)]", "[f()(y=1)]", "['s'.f(y=1)]",
    "[\n  f(x=1),\n  g(y=2)\n]", "[f(x=1)]  ", "``` [f(x=1)] ```", "\n\n[f(x=1)]\n", "[f(x=1)]\t",
    "[f(x=1)] # done", "[f(\n x=1, # one\n y=2)]", "[f(x=1);]", "[f(x=1) g(y=2)]", "[f(x=1)]]", "[[f(x=1)]",
    "'[f(x=1)]'", "''[f(x=1)]''", "[f(x=1)]'", "[f(x='a\nb')]", "[f(x='''a\nb''')]", "[f(x=1) if a else g(y=2)]",
    "[print(x=1)]", "[f(x=1), 5]", "[lambda: f(x=1)]", "[f(x=1) for _ in y]", "[await f(x=1)]",
]


def stress_lines(entry):
    """Raw texts around the entry's first ground-truth call."""
    name, args = gt_calls(entry)[0]
    out = []
    if args:
        param = next(iter(args))
        rest = render_args({k: v for k, v in args.items() if k != param})
        for expr in STRESS_VALUES:
            out.append(("stress_value", f"[{name}({param}={expr}{', ' + rest if rest else ''})]"))
    for text in STRESS_TEXTS:
        out.append(("stress_text", text.replace("f(", name + "(", 1)))
    return out


# ------------------------------------------------------------------ java / javascript source


def java_src(v, t, items=None):
    """The string the tree-sitter Java decoder yields for a value of type t."""
    if isinstance(v, str):
        return v  # a variable name or the unquoted string literal
    if t in ("integer", "byte", "short"):
        return str(v)
    if t == "long":
        return f"{v}L"
    if t == "float":
        return f"{float(v)}f"
    if t == "double":
        return repr(float(v))
    if t == "boolean":
        return "true" if v else "false"
    if t == "Array":
        el = {"integer": str, "long": lambda x: f"{x}L", "String": lambda x: f'"{x}"', "char": lambda x: f"'{x}'"}.get(items, str)
        elem_type = {"integer": "int", "long": "long", "String": "String", "char": "char"}.get(items, "Object")
        return f"new {elem_type}[]{{" + ",".join(el(x) for x in v) + "}"
    if t == "ArrayList":
        el = {"String": lambda x: f'"{x}"', "long": lambda x: f"{x}L"}.get(items, str)
        return "new ArrayList<>(Arrays.asList(" + ", ".join(el(x) for x in v) + "))"
    if t == "HashMap":
        puts = " ".join(f'put("{k}", {json.dumps(x) if isinstance(x, str) else java_src(x, "any")});' for k, x in v.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def js_src(v, t, items=None, rng=None):
    if t == "String":
        if isinstance(v, str) and rng:
            return rng.choice([v, f"'{v}'", f'"{v}"'])
        return str(v)
    if isinstance(v, str):
        return v
    if t in ("integer", "float", "Bigint"):
        if isinstance(v, bool):
            return "true" if v else "false"
        return (str(v) + "n") if t == "Bigint" else repr(v)
    if t == "Boolean":
        return "true" if v else "false"
    if t == "array":
        def el(x):
            if isinstance(x, str):
                return f"'{x}'"
            if isinstance(x, list):
                return "[" + ", ".join(el(y) for y in x) + "]"
            return json.dumps(x)
        return "[" + ", ".join(el(x) for x in v) + "]"
    if t == "dict":
        def val(x):
            if isinstance(x, str):
                return f"'{x}'"
            if isinstance(x, bool):
                return "true" if x else "false"
            if isinstance(x, list):
                return "[" + ", ".join(val(y) for y in x) + "]"
            if isinstance(x, dict):
                return "{" + ", ".join(f"{k}: {val(y)}" for k, y in x.items()) + "}"
            return json.dumps(x)
        return val(v) if isinstance(v, dict) else str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def source_calls(entry, calls, java, rng=None):
    out = []
    for name, args in calls:
        doc = doc_by_name(entry, name)
        props = doc["parameters"]["properties"] if doc else {}
        sargs = {}
        for k, v in args.items():
            schema = props.get(k, {})
            t, items = schema.get("type", "any"), schema.get("items", {}).get("type")
            sargs[k] = java_src(v, t, items) if java else js_src(v, t, items, rng)
        out.append({name: sargs})
    return out


def source_variants(entry, rng, java):
    """(variant, decoded) pairs for a java/javascript entry."""
    calls = gt_calls(entry)
    out = [("gt", source_calls(entry, calls, java)), ("gt_alt", source_calls(entry, gt_calls(entry, rng), java, rng))]
    (name, dec), = out[0][1][0].items()
    doc = doc_by_name(entry, name)
    props = doc["parameters"]["properties"]
    types = {p: s["type"] for p, s in props.items()}

    def with_args(new_args, new_name=name):
        return [{new_name: new_args}]

    if dec:
        p = rng.choice(list(dec))
        out.append(("wrong_value", with_args({**dec, p: dec[p] + "9" if rng.random() < 0.5 else "zq" + dec[p]})))
        p = rng.choice(list(dec))
        out.append(("non_string", with_args({**dec, p: rng.choice([1, 2.5, True, ["a"], None])})))
        p = rng.choice(list(dec))
        t = types.get(p)
        v = dec[p]
        if java:
            alt = {"long": v.rstrip("lL"), "float": v.rstrip("fF"), "double": v + "d", "integer": v + ".0",
                   "boolean": v.capitalize(), "String": f'"{v}"', "any": f'"{v}"'}.get(t, v.replace(",", ", "))
        else:
            alt = {"float": v.split(".")[0] if "." in v else v + ".5", "integer": v + ".0", "Boolean": v.upper(),
                   "String": v.upper(), "array": v.replace("'", '"'), "dict": v.replace(": ", ":"), "any": f"'{v}'"}.get(t, v + " ")
        out.append(("type_syntax", with_args({**dec, p: alt})))
        req = [r for r in doc["parameters"]["required"] if r in dec]
        if req:
            p = rng.choice(req)
            out.append(("missing_required", with_args({k: v for k, v in dec.items() if k != p})))
        out.append(("string_case", with_args({k: (v.upper() if types.get(k) in ("String", "any") else v) for k, v in dec.items()})))
    out.append(("extra_param", with_args({**dec, "zqExtra": "1"})))
    absent = [p for p in props if p not in dec]
    if absent:
        p = rng.choice(absent)
        out.append(("doc_param_not_in_gt", with_args({**dec, p: "1"})))
    out.append(("wrong_name", with_args(dec, name + "X")))
    out.append(("two_calls", out[0][1] + out[0][1]))
    out.append(("no_calls", []))
    out.append(("not_call_format", rng.choice([{}, [{name: "x"}], [{name: dec, "other": {}}], [[name]]])))
    out.append(("decode_failed", None))
    return out


# ------------------------------------------------------------------ java / javascript raw text


def java_string(s):
    """A Java string literal as a model writes it (non-ASCII left as is)."""
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return '"' + out + '"'


def is_plain_name(s):
    """A variable or member name (`ctx`, `a.b`) rather than text."""
    return bool(re.fullmatch(r"[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)*", s)) and s not in ("true", "false", "null")


def java_raw(v, t, items=None):
    """Java source for a value of BFCL type t, as a prompt-mode model writes it."""
    if isinstance(v, str):
        # A String parameter gets a literal; elsewhere a name is a variable.
        return v if t != "String" and is_plain_name(v) else java_string(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if t == "Array" and isinstance(v, list):
        elem = {"integer": "int", "long": "long", "String": "String", "char": "char"}.get(items, "Object")
        return f"new {elem}[]{{" + ", ".join(java_raw(x, items or "any") for x in v) + "}"
    if t == "ArrayList" and isinstance(v, list):
        return "new ArrayList<>(Arrays.asList(" + ", ".join(java_raw(x, items or "any") for x in v) + "))"
    if t == "HashMap" and isinstance(v, dict):
        puts = " ".join(f"put({java_string(k)}, {java_raw(x, 'String' if isinstance(x, str) else 'any')});" for k, x in v.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    if isinstance(v, (list, dict)):
        return "new Object[]{" + ", ".join(java_raw(x, "any") for x in (v if isinstance(v, list) else v.values())) + "}"
    return java_src(v, t, items)


def js_raw(v, t, items=None, quote="'"):
    """JavaScript source for a value of BFCL type t."""
    if isinstance(v, str):
        if t != "String" and re.fullmatch(r"[A-Za-z_$][\w$.]*(\(.*\))?", v):
            return v  # a variable, member or call expression
        escaped = v.replace("\\", "\\\\").replace(quote, "\\" + quote).replace("\n", "\\n")
        return quote + escaped + quote
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return (str(v) + "n") if t == "Bigint" else repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(js_raw(x, items or "String", None, quote) for x in v) + "]"
    if isinstance(v, dict):
        key = lambda k: k if re.fullmatch(r"[A-Za-z_$][\w$]*", k) else quote + k + quote
        return "{" + ", ".join(f"{key(k)}: {js_raw(x, 'any', None, quote)}" for k, x in v.items()) + "}"
    return str(v)


def raw_args(entry, name, args, java, quote="'", sep=", ", eq="="):
    doc = doc_by_name(entry, name)
    props = doc["parameters"]["properties"] if doc else {}
    parts = []
    for k, v in args.items():
        if k is None:
            parts.append(v.text)
            continue
        if isinstance(v, Raw):
            parts.append(f"{k}{eq}{v.text}")
            continue
        schema = props.get(k, {})
        t, items = schema.get("type", "any"), schema.get("items", {}).get("type")
        parts.append(f"{k}{eq}{java_raw(v, t, items) if java else js_raw(v, t, items, quote)}")
    return sep.join(parts)


def raw_call(entry, name, args, java, **style):
    return f"{name}({raw_args(entry, name, args, java, **style)})"


# Ways a reply's text goes wrong around a correct call (C stands for it).
SOURCE_LAYOUTS = [
    "[C]", "C", "[C;]", "C;", "[C, C]", "[C; C]", "[C;\nC;]", "[C\nC]", "[C] [C]", "[C]\n[C]",
    "```\n[C]\n```", "```java\n[C]\n```", "```javascript\n[C]\n```", "Sure! [C]", "[C] I hope this helps.",
    "'[C]'", "[[C]]", "[C]]", "[[C]", "[(C)]", "[!C]", "[C;;]", "[;C]", "[// call\nC]", "[C // done]",
    "[/* c */ C]", "[C /* c */]", "[x = C;]", "[var x = C;]", "[int x = C;]", "[return C;]", "[await C]",
    "[new C]", "[C.then(r => r)]", "[{ C; }]", "[if (ok) C;]", "[label: C]", "['use strict'; C]",
    "[function f() { C; }]", "[class X { void m() { C; } }]", "[C + C]", "[C ? C : C]", "  \n[C] \n", "[C]\t",
]

# Argument values models write, right and wrong, for Java...
JAVA_STRESS_VALUES = [
    '"plain"', '""', '"with \\"escaped\\" quotes"', '"tab\\tnew\\nline"', '"back\\\\slash"', '"\\u00e9"',
    '"São Paulo"', '"日本語"', '"emoji 🙂"', "'c'", "'\\n'", "'é'", "'ab'", "''", '"""\n  text block\n  """',
    '"unterminated', "42", "-42", "+42", "0x1F", "0b101", "017", "1_000", "5L", "5l", "1.5f", "1.5F", "2.5d",
    "1e10", ".5", "5.", "-0.0", "Double.MAX_VALUE", "Integer.MIN_VALUE", "true", "false", "True", "null",
    "None", "this", "super.x", "new int[]{1, 2, 3}", "new int[] {}", 'new String[]{"a", "b"}',
    "new int[][]{{1, 2}, {3}}", "new int[3]", "new int[]{1, 2,}", 'new Object[]{1, "a", null}',
    "new char[]{'a', 'b'}", "new ArrayList<>()", "new ArrayList<>(Arrays.asList(1, 2))",
    'new ArrayList<String>(List.of("a"))', "new HashMap<>()",
    'new HashMap<String, Integer>() {{ put("a", 1); put("b", 2); }}', "new java.util.Date()",
    "new Foo.Bar(1)", 'new Foo(new Bar(1), "s")', "new Foo() { void m() { g(1); } }", "new Foo(/* none */)",
    "new <String>Foo()", "outer.new Inner()", "Arrays.asList(1, 2)", 'List.of("a", "b")',
    'Map.of("k", 1)', 'System.getenv("HOME")', "obj.method()", "a.b.c", "a[0]", "a[i][j]", "(int) 5.5",
    "(String) obj", "x -> x + 1", "(a, b) -> a * b", "String::valueOf", "a ? b : c", "a + b", '"a" + "b"',
    "1 + 2 * 3", "!flag", "~5", "x++", "i instanceof Integer", "String.class", "int.class", "int[].class",
    "(1)", '(("x"))', "{1, 2}", "[1, 2]", '{"k": 1}', "'single quoted text'", "unquoted words here",
    "`tpl`", "y = 5", "@Anno", "/* c */ 5", "5 // trailing\n", "#", "$var", "_x", "café", "Σ", "1..2",
    "switch (x) { default -> 1; }", "new", "",
]

# ... and for JavaScript.
JS_STRESS_VALUES = [
    "'plain'", '"double"', "''", '""', "'it\\'s'", '"say \\"hi\\""', "'tab\\t'", "'é'", "'日本語'",
    "'emoji 🙂'", "`template`", "`a ${b} c`", "'mixed\"", "'unterminated", "42", "-42", "+42", "4.2", ".5",
    "5.", "1e3", "0x1F", "0o17", "0b101", "1_000", "10n", "NaN", "Infinity", "-Infinity", "true", "false",
    "null", "undefined", "this", "True", "None", "[1, 2, 3]", "[]", "['a', 'b']", "[1, [2, 3]]",
    "[1, 2,]", "[, 1]", "{}", "{a: 1}", "{'a': 1}", '{"a": 1, "b": [1, 2]}', "{a: {b: 'c'}}", "{a}",
    "{...o}", "{a: 1,}", "{[k]: 1}", "x", "a.b", "a.b.c", "a[0]", "a?.b", "f()", "f(1, 2)", "a.b(c)",
    "f(k=1)", "new Date()", "new Date('2020-01-01')", "new Map([[1, 2]])", "x => x + 1", "(a, b) => a * b",
    "function() { return 1; }", "async () => 1", "await x", "typeof x", "!x", "-x", "a + b", "'a' + 'b'",
    "a ? b : c", "a || b", "a ?? b", "a, b", "/ab+c/i", "/[a-z]/g", "x++", "...args", "class {}",
    "void 0", "delete a.b", "y = b", "(1)", "('s')", "{a: 1", "[1, 2", "hello world", "1 2", "#x", "@x",
    "a..b", "'a' 'b'", "Date.now()", "Math.PI", "JSON.stringify({a: 1})", "<div/>", "<a>text</a>",
    "// note\n1", "/* c */ 1", "1 /* c */", "café", "\\u0041", "",
]


def stress_source_lines(entry, java):
    """Raw texts around the entry's first ground-truth call: each stress
    value in place of its first argument, and each layout of the call."""
    name, args = gt_calls(entry)[0]
    out = []
    if args:
        param = next(iter(args))
        rest = {k: v for k, v in args.items() if k != param}
        for expr in JAVA_STRESS_VALUES if java else JS_STRESS_VALUES:
            out.append(("raw_stress_value", "[" + raw_call(entry, name, {param: Raw(expr), **rest}, java) + "]"))
        # Nesting around where BFCL's recursive Java decoder runs out of Python
        # frames, called as bfcl_official_check.py calls it (Python 3.11); the
        # JavaScript decoder does not recurse.
        nests = [(329, "(", ")"), (330, "(", ")"), (988, "new F(", ")"), (989, "new F(", ")"),
                 (247, "new int[]{", "}"), (248, "new int[]{", "}"), (2000, "(", ")")] if java else \
                [(2000, "(", ")"), (2000, "[", "]"), (1000, "{a: ", "}")]
        for depth, open_, close in nests:
            deep = Raw(open_ * depth + "1" + close * depth)
            out.append(("raw_stress_deep", "[" + raw_call(entry, name, {param: deep, **rest}, java) + "]"))
    call = raw_call(entry, name, args, java)
    for depth in (988, 989):
        out.append(("raw_stress_deep", "[" + "(" * depth + call + ")" * depth + "]"))
    for layout in SOURCE_LAYOUTS:
        out.append(("raw_stress_layout", layout.replace("C", call)))
    return out


def mutate_text(text, rng):
    """One syntax slip applied to a rendered reply."""
    kinds = [
        lambda t: t[:-1],  # lost closing bracket
        lambda t: t[:-2] + "]",  # lost closing parenthesis
        lambda t: t + ")",
        lambda t: t[1:],
        lambda t: t.replace("=", ":", 1),
        lambda t: t.replace("=", " = ", 1),
        lambda t: t.replace("=", "==", 1),
        lambda t: t.replace(", ", " ", 1),
        lambda t: t.replace(", ", ",, ", 1),
        lambda t: t.replace(")", ",)", 1) if t.count(")") else t + ",",
        lambda t: t.replace('"', "", 1),
        lambda t: t.replace('"', "'"),
        lambda t: t.replace("'", '"'),
        lambda t: t.replace("true", "True").replace("false", "False"),
        lambda t: t.replace("(", " (", 1),
        lambda t: t.replace("(", "({", 1).replace(")]", "})]", 1),
        lambda t: t.replace("[", "[#", 1),
        lambda t: "Sure! " + t,
        lambda t: t + " Done.",
        lambda t: "'" + t + "'",
        lambda t: t.replace("[", "", 1).replace("]", "", 1) + ";",
        lambda t: t.replace("(", "(\n  ", 1).replace(", ", ",\n  "),
        lambda t: t.upper(),
    ]
    return rng.choice(kinds)(text)


def raw_source_variants(entry, rng, java):
    """(variant, raw text) pairs for a java/javascript entry: the prompt-mode
    replies that BFCL's tree-sitter decoders read."""
    calls = gt_calls(entry)
    name, args = calls[0]
    doc = doc_by_name(entry, name)
    required = doc["parameters"]["required"] if doc else []
    call = lambda n, a, **style: raw_call(entry, n, a, java, **style)
    out = [("raw_gt", f"[{call(name, args)}]")]
    quote = rng.choice(["'", '"'])
    style = {"quote": quote, "sep": rng.choice([", ", ",", " , ", ",\n"]), "eq": rng.choice(["=", " = "])}
    alt_name, alt_args = gt_calls(entry, rng)[0]
    text = call(alt_name, alt_args, **style)
    wrap = rng.choice(["[T]", "T", "```\n[T]\n```", "  \n[T] \n", "[T;]", "```java\n[T]\n```" if java else "```js\nT\n```"])
    out.append(("raw_gt_alt", wrap.replace("T", text)))
    if args:
        p = rng.choice(list(args))
        out.append(("raw_wrong_value", f"[{call(name, {**args, p: wrong_value(args[p], rng)})}]"))
        p = rng.choice(list(args))
        out.append(("raw_wrong_type", f"[{call(name, {**args, p: wrong_type(args[p], rng)})}]"))
        strs = [k for k, v in args.items() if isinstance(v, str)]
        if strs:
            p = rng.choice(strs)
            v = args[p]
            # A string written the other way: a bare name quoted, a literal bare.
            other = java_string(v) if java else f"'{v}'"
            src = call(name, {p: v})
            out.append(("raw_requoted", f"[{call(name, {**args, p: Raw(v if other in src else other)})}]"))
            out.append(("raw_string_variant", f"[{call(name, {**args, p: string_variant(v, rng)})}]"))
        req_present = [r for r in required if r in args]
        if req_present:
            p = rng.choice(req_present)
            out.append(("raw_missing_required", f"[{call(name, {k: v for k, v in args.items() if k != p})}]"))
        p = rng.choice(list(args))
        dup = raw_args(entry, name, args, java) + ", " + raw_args(entry, name, {p: args[p]}, java)
        out.append(("raw_repeated", f"[{name}({dup})]"))
        keys = list(args)
        rng.shuffle(keys)
        out.append(("raw_reordered", f"[{call(name, {k: args[k] for k in keys})}]"))
    out.append(("raw_extra_param", f"[{call(name, {**args, 'zqExtra': rng.choice([1, 'x', True])})}]"))
    out.append(("raw_positional", f"[{call(name, {None: Raw(rng.choice(['ctx', 'true', '42', 'String.class', 'null'])), **args})}]"))
    out.append(("raw_wrong_name", f"[{call(name + rng.choice(['X', '_v2', '.run']), args)}]"))
    out.append(("raw_no_args", f"[{name}()]"))
    out.append(("raw_two_calls", "[" + rng.choice([", ", "; ", "\n", ";\n"]).join([call(name, args)] * 2) + "]"))
    out.append(("raw_empty", rng.choice(["[]", "", "``` ```", "[;]"])))
    out.append(("raw_prose", rng.choice(["I cannot help with that.", "Call it with the given values.", "[None]"])))
    # Syntax slips: several per entry, malformed replies are the ones that get scored.
    base = f"[{call(name, args)}]"
    seen = set()
    for _ in range(6):
        slipped = mutate_text(base, rng)
        if slipped not in seen and slipped != base:
            seen.add(slipped)
            out.append(("raw_slip", slipped))
    return out


# ------------------------------------------------------------------ irrelevance


def irrelevance_variants(entry, rng):
    doc = rng.choice(entry["function"])
    props = doc["parameters"]["properties"]
    args = {p: (1 if s.get("type") in ("integer", "float") else "x") for p, s in props.items()}
    call = render_calls([(doc["name"], args)])
    return [
        ("prose", rng.choice(["I cannot help with that.", "None of the functions apply.", "The answer is 42."])),
        ("empty_list", rng.choice(["[]", "```\n[]\n```", " [] "])),
        ("empty_text", ""),
        ("call", call),
        ("call_no_args", f"[{doc['name']}()]"),
        ("call_bare", call[1:-1]),
        ("prose_with_call", "You could call " + call),
        ("syntax_error", call[:-3]),
    ]


# ------------------------------------------------------------------ main


def underscored(decoded, keep_dots):
    out = []
    for call in decoded:
        (name, args), = call.items()
        out.append({name if keep_dots else name.replace(".", "_"): args})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel_dir")
    ap.add_argument("--fc", action="store_true", help="FC-mode decoded lines (check with --underscore-to-dot)")
    ap.add_argument("--seed", type=int, default=20240321)
    args = ap.parse_args()
    root = data_dir(args.wheel_dir)

    for category in CATEGORIES:
        questions = load_jsonl(os.path.join(root, f"BFCL_v4_{category}.json"))
        answers = None
        if category != "irrelevance":
            answers = load_jsonl(os.path.join(root, "possible_answer", f"BFCL_v4_{category}.json"))
        for i, q in enumerate(questions):
            entry = dict(q)
            if answers is not None:
                entry["ground_truth"] = answers[i]["ground_truth"]
            rng = random.Random(args.seed ^ zlib.crc32(q["id"].encode()))
            base = {"id": q["id"], "category": category}
            if args.fc:
                lines = fc_lines(entry, category, rng)
            elif category == "irrelevance":
                lines = [(v, "raw", t) for v, t in irrelevance_variants(entry, rng)]
            elif category in ("simple_java", "simple_javascript"):
                java = category == "simple_java"
                lines = [(v, "decoded", d) for v, d in source_variants(entry, rng, java)]
                lines += [(v, "raw", t) for v, t in raw_source_variants(entry, rng, java)]
                if i % 4 == 0:
                    lines += [(v, "raw", t) for v, t in stress_source_lines(entry, java)]
            else:
                lines = [(v, "raw", t) for v, t in python_variants(entry, rng)]
                if category == "simple_python" and i % 8 == 0:
                    lines += [(v, "raw", t) for v, t in stress_lines(entry)]
            for variant, key, payload in lines:
                print(json.dumps({**base, "variant": variant, key: payload}, ensure_ascii=False))


def fc_lines(entry, category, rng):
    """Decoded lines as an FC model returns them (JSON arguments)."""
    if category == "irrelevance":
        doc = rng.choice(entry["function"])
        return [("fc_no_call", "decoded", []), ("fc_call", "decoded", [{doc["name"].replace(".", "_"): {}}]),
                ("fc_not_dict", "decoded", [{doc["name"]: "x"}]), ("fc_failed", "decoded", None)]
    if category in ("simple_java", "simple_javascript"):
        decoded = source_calls(entry, gt_calls(entry), category == "simple_java")
    else:
        decoded = [{n: a} for n, a in gt_calls(entry)]
    lines = [("fc_gt", "decoded", underscored(decoded, False)), ("fc_dotted", "decoded", underscored(decoded, True))]
    (name, args), = decoded[0].items()
    nums = [k for k, v in args.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if nums:
        k = rng.choice(nums)
        v = args[k]
        flipped = float(v) if isinstance(v, int) else (int(v) if v == int(v) else v)
        changed = [{**{name: {**args, k: flipped}}}] + decoded[1:]
        lines.append(("fc_number_type", "decoded", underscored(changed, False)))
    lines.append(("fc_not_call_format", "decoded", [{name.replace(".", "_"): args, "extra": {}}]))
    return lines


if __name__ == "__main__":
    main()
