"""Regenerate the pinned-wire test vectors from the Python reference.

Run from the workspace root with the reference installed:

    .venv/bin/python crates/pinned-wire/tests/vectors/generate.py

Writes attestation.json and ids.json next to this script. Every expected
value is computed by calling the reference (pinned 0.16.0) or the framework
it answers through; nothing here restates a rule. Where the Rust crate
deliberately maps a Python value it cannot hold, the mapping is applied in
`rust_view` and the Python outcome is recorded beside it.
"""

import base64
import hashlib
import hmac
import json
import math
import re
import sys
import types
from pathlib import Path
from urllib.parse import unquote

from fastapi import HTTPException
from starlette.responses import JSONResponse

import pinned
import importlib

att = importlib.import_module("pinned.pinboard.attestation")
from pinned.pinboard import wire

OUT = Path(__file__).resolve().parent
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
SURROGATE = re.compile("[\ud800-\udfff]")


# --- helpers -----------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def mac(secret: str, signing_input: str) -> str:
    digest = hmac.new(
        secret.encode(), signing_input.encode(), hashlib.sha256
    ).digest()
    return b64(digest)


def signed(secret: str, header_seg: str, claims_seg: str) -> str:
    signing_input = f"{header_seg}.{claims_seg}"
    return f"{signing_input}.{mac(secret, signing_input)}"


HEADER = b64(b'{"alg":"HS256","typ":"pinboard+jwt"}')


def raw_claims(secret: str, claims_text: str | bytes, header_seg: str = HEADER) -> str:
    data = claims_text.encode() if isinstance(claims_text, str) else claims_text
    return signed(secret, header_seg, b64(data))


def sat(v):
    return max(I64_MIN, min(I64_MAX, v))


def clean_str(s: str) -> str:
    return SURROGATE.sub("\ufffd", s)


def clean_value(v):
    """A JSON value as serde_json can hold it (see Account::claims docs)."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        if I64_MIN <= v <= 2**64 - 1:
            return v
        return float(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return clean_str(v)
    if isinstance(v, list):
        return [clean_value(x) for x in v]
    return {clean_str(k): clean_value(x) for k, x in v.items()}


def rust_view(claims):
    """Verified Python claims as the Rust `Claims` struct holds them."""
    if claims is None:
        return None
    out = {
        "aud": clean_str(claims["aud"]),
        "iat": sat(claims["iat"]),
        "exp": sat(claims["exp"]),
    }
    if "caller" in claims:
        out["caller"] = clean_str(claims["caller"])
    if "depth" in claims:
        out["depth"] = sat(claims["depth"])
    if "acct" in claims:
        acct = claims["acct"]
        out["acct"] = {
            "sub": clean_str(acct["sub"]),
            "scopes": [clean_str(s) for s in acct.get("scopes", [])],
            "claims": clean_value(acct.get("claims", {})),
        }
    return out


def caller_view(claims):
    """The reference's attestation(conn) for these claims, as plain JSON."""
    if claims is None:
        return None
    conn = types.SimpleNamespace(scope={att.ATTESTATION_SCOPE_KEY: claims})
    who = pinned.attestation(conn)
    if who is None:
        return None
    if isinstance(who, pinned.Attestation.Instance):
        return {
            "kind": "instance",
            "ns": clean_str(who.ns),
            "id": clean_str(who.id),
            "depth": sat(who.depth),
        }
    return {
        "kind": "account",
        "sub": clean_str(who.sub),
        "claims": clean_value(dict(who.claims)),
        "scopes": sorted(clean_str(s) for s in who.scopes),
    }


# --- mint ----------------------------------------------------------------------

SECRETS = [
    "secret",
    "",
    "0123456789abcdef" * 4,  # 64 bytes: exactly one HMAC block
    "k" * 65,  # longer than a block: hashed first
    "s\u00e9cr\u00e8t-\u00fc\u00f1\u00ee\u00e7\u00f8d\u00e9",
    "\U0001f511 key \u2603",
    "a" * 300,
]
AUDS = [
    "sess-1",
    "",
    "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    "caf\u00e9",
    "\u65e5\u672c\u8a9e",
    "emoji \U0001f600 \U0010ffff \U00010000",
    'quote " backslash \\ slash /',
    "ctl \x00\x01\x08\x09\x0a\x0c\x0d\x1f\x7f end",
    "\u2028\u2029\ufeff\uffff",
]
NOWS = [1_800_000_000.0, 1_800_000_000.999999, 0.0, 0.5, 1_699_999_999.25, -1.5, -0.5, 1e12 + 0.75, 12345.0]
CALLERS = [None, "/threads/a", "/ns/id-\u00e9", "", "/a/b/c", "no-slash", "/\U0001f600/x"]
DEPTHS = [None, 0, 1, 50, 51, -1, 2**62, -(2**63)]


def mint_cases():
    cases = []
    i = 0
    for secret in SECRETS:
        for aud in AUDS:
            now = NOWS[i % len(NOWS)]
            caller = CALLERS[i % len(CALLERS)]
            depth = DEPTHS[i % len(DEPTHS)]
            i += 1
            cases.append((secret, aud, now, caller, depth))
    for caller in CALLERS:
        for depth in DEPTHS:
            cases.append(("secret", "sess-1", 1_800_000_000.7, caller, depth))
    for now in NOWS:
        cases.append(("secret", "sess-1", now, None, None))
    out = []
    for secret, aud, now, caller, depth in cases:
        token = att.mint_attestation(secret, aud=aud, now=now, caller=caller, depth=depth)
        out.append(
            {
                "secret": secret,
                "aud": aud,
                "now": repr(now),
                "caller": caller,
                "depth": depth,
                "token": token,
            }
        )
    return out


# --- verify ----------------------------------------------------------------------

NOW = 1_800_000_000
K = "worker-secret"
AUD = "sess-1"


def std_claims(**extra) -> str:
    claims = {"aud": AUD, "iat": NOW, "exp": NOW + 30}
    claims.update(extra)
    return json.dumps(claims, separators=(",", ":"))


def verify_cases():
    c = []  # (name, token, secret, audiences, now)

    def add(name, token, *, secret=K, audiences=(AUD,), now=NOW + 1.0):
        c.append((name, token, secret, list(audiences), now))

    good = att.mint_attestation(K, aud=AUD, now=NOW + 0.9, caller="/threads/a", depth=2)
    add("minted", good)
    add("minted, no caller", att.mint_attestation(K, aud=AUD, now=NOW))
    add("minted, other audience accepted too", good, audiences=("x", AUD, "y"))
    add("minted, no audiences", good, audiences=())
    add("wrong audience", good, audiences=("sess-2",))
    add("wrong secret", good, secret=K + "x")
    add("empty secret minted", att.mint_attestation("", aud=AUD, now=NOW), secret="")
    add("non-ascii secret", att.mint_attestation("\u00e9\U0001f511", aud=AUD, now=NOW), secret="\u00e9\U0001f511")
    add("non-ascii secret, wrong", att.mint_attestation("\u00e9\U0001f511", aud=AUD, now=NOW), secret="e\U0001f511")
    add("non-ascii audience", att.mint_attestation(K, aud="caf\u00e9 \U0001f600", now=NOW), audiences=("caf\u00e9 \U0001f600",))

    # Skew edges: minted at NOW + 0.9 => iat NOW, exp NOW + 30.
    for now in (NOW - 30, NOW - 30.000001, NOW - 29.5, NOW + 60, NOW + 60.000001, NOW + 59.999, NOW - 31, NOW + 61, NOW + 0.0, NOW + 30.5):
        add(f"skew now={now!r}", good, now=now)

    # Structure.
    h, p, m = good.split(".")
    add("empty token", "")
    add("two parts", f"{h}.{p}")
    add("four parts", f"{good}.x")
    add("four parts signed", signed(K, h, p + "." + p))
    add("extra dot in mac", f"{h}.{p}.{m[:10]}.{m[10:]}")
    flipped = m[:-1] + ("A" if m[-1] != "A" else "B")
    add("tampered mac last char", f"{h}.{p}.{flipped}")
    add("tampered mac first char", f"{h}.{p}.{'B' if m[0] == 'A' else 'A'}{m[1:]}")
    add("mac with padding", f"{h}.{p}.{m}=")
    add("mac truncated", f"{h}.{p}.{m[:-1]}")
    add("mac empty", f"{h}.{p}.")
    # A MAC that holds '-' or '_', so the standard alphabet spells it differently.
    urlsafe = next(
        t
        for t in (att.mint_attestation(K, aud=AUD, now=NOW, depth=d) for d in range(100))
        if "-" in t.split(".")[2] or "_" in t.split(".")[2]
    )
    uh, up, um = urlsafe.split(".")
    add("mac urlsafe", urlsafe)
    add("mac standard alphabet", f"{uh}.{up}.{um.replace('-', '+').replace('_', '/')}")
    add("mac non-ascii (python raises)", f"{h}.{p}.{m[:-1]}\u00e9")
    add("payload tampered", f"{h}.{p[:-2]}{'AA' if p[-2:] != 'AA' else 'BB'}.{m}")
    add("payload swapped, old mac", f"{h}.{b64(std_claims().encode())}.{m}")

    # Header variants (all correctly signed).
    def header(text: str | bytes) -> str:
        return b64(text.encode() if isinstance(text, str) else text)

    P = b64(std_claims().encode())
    add("header alg none", signed(K, header('{"alg":"none","typ":"pinboard+jwt"}'), P))
    add("header typ JWT", signed(K, header('{"alg":"HS256","typ":"JWT"}'), P))
    add("header reordered", signed(K, header('{"typ":"pinboard+jwt","alg":"HS256"}'), P))
    add("header spaced", signed(K, header('{ "alg": "HS256",\n "typ": "pinboard+jwt" } '), P))
    add("header escaped", signed(K, header('{"alg":"HS\\u0032\\u0035\\u0036","typ":"pinboard\\/jwt"}'.replace("\\/", "+")), P))
    add("header extra key", signed(K, header('{"alg":"HS256","typ":"pinboard+jwt","kid":"1"}'), P))
    add("header missing typ", signed(K, header('{"alg":"HS256"}'), P))
    add("header duplicate key last wins", signed(K, header('{"alg":"none","alg":"HS256","typ":"pinboard+jwt"}'), P))
    add("header duplicate key last loses", signed(K, header('{"alg":"HS256","alg":"none","typ":"pinboard+jwt"}'), P))
    add("header utf-8 bom", signed(K, header(b'\xef\xbb\xbf{"alg":"HS256","typ":"pinboard+jwt"}'), P))
    add("header utf-16", signed(K, header('{"alg":"HS256","typ":"pinboard+jwt"}'.encode("utf-16")), P))
    add("header utf-16-le no bom", signed(K, header('{"alg":"HS256","typ":"pinboard+jwt"}'.encode("utf-16-le")), P))
    add("header utf-32-be no bom", signed(K, header('{"alg":"HS256","typ":"pinboard+jwt"}'.encode("utf-32-be")), P))
    add("header utf-32", signed(K, header('{"alg":"HS256","typ":"pinboard+jwt"}'.encode("utf-32")), P))
    add("header array", signed(K, header('["HS256"]'), P))
    add("header not json", signed(K, header("HS256"), P))
    add("header empty", signed(K, "", P))
    add("header padded", signed(K, HEADER + "=" * (-len(HEADER) % 4), P))
    add("header bad base64 length", signed(K, HEADER + "A", P))
    add("header junk chars skipped", signed(K, HEADER[:8] + "!*" + HEADER[8:], P))
    add("header non-ascii", signed(K, HEADER + "\u00e9", P))
    add("header invalid utf-8", signed(K, header(b'{"alg":"HS256","typ":"pinboard+jwt\xff"}'), P))

    # Claims segment encodings.
    text = std_claims(caller="/n/\u00e9??>>")
    seg = b64(text.encode())
    add("claims standard alphabet", signed(K, HEADER, seg.replace("-", "+").replace("_", "/")))
    add("claims padded", signed(K, HEADER, seg + "=" * (-len(seg) % 4)))
    add("claims over-padded", signed(K, HEADER, seg + "=" * (-len(seg) % 4) + "===="))
    add("claims junk then data", signed(K, HEADER, seg + "!"))
    add("claims data after padding", signed(K, HEADER, b64(b"{}") + "==" + seg))
    add("claims utf-16", raw_claims(K, std_claims().encode("utf-16")))
    add("claims utf-16-be no bom", raw_claims(K, std_claims().encode("utf-16-be")))
    add("claims utf-8 bom", raw_claims(K, b"\xef\xbb\xbf" + std_claims().encode()))
    add("claims double bom", raw_claims(K, b"\xef\xbb\xbf\xef\xbb\xbf" + std_claims().encode()))
    add("claims encoded surrogate in caller", raw_claims(K, std_claims()[:-1].encode() + b',"caller":"/n/\xed\xa0\x80"}'))
    add("claims invalid utf-8", raw_claims(K, std_claims()[:-1].encode() + b',"x":"\xff"}'))
    add("claims trailing garbage", raw_claims(K, std_claims() + "x"))
    add("claims whitespace", raw_claims(K, " \t\n" + std_claims().replace(",", " ,\r\n ") + " \n"))
    add("claims form feed", raw_claims(K, "\f" + std_claims()))
    add("claims not json", raw_claims(K, "claims"))
    add("claims array", raw_claims(K, "[1,2]"))
    add("claims string", raw_claims(K, '"x"'))
    add("claims number", raw_claims(K, "1"))
    add("claims null", raw_claims(K, "null"))
    add("claims empty object", raw_claims(K, "{}"))
    add("claims empty", raw_claims(K, ""))
    add("claims trailing comma", raw_claims(K, std_claims()[:-1] + ",}"))
    add("claims raw control char", raw_claims(K, std_claims()[:-1] + ',"x":"a\x01"}'))
    add("claims raw del char", raw_claims(K, std_claims()[:-1] + ',"x":"a\x7f"}'))

    # iat / exp.
    def claims(**kv) -> str:
        return raw_claims(K, json.dumps(kv, separators=(",", ":")))

    def text_claims(body: str) -> str:
        return raw_claims(K, body)

    add("iat missing", claims(aud=AUD, exp=NOW + 30))
    add("exp missing", claims(aud=AUD, iat=NOW))
    add("iat true", claims(aud=AUD, iat=True, exp=NOW + 30))
    add("exp false", claims(aud=AUD, iat=NOW, exp=False))
    add("iat float", text_claims(f'{{"aud":"{AUD}","iat":{NOW}.0,"exp":{NOW + 30}}}'))
    add("exp float", text_claims(f'{{"aud":"{AUD}","iat":{NOW},"exp":{NOW + 30}.0}}'))
    add("iat exponent", text_claims(f'{{"aud":"{AUD}","iat":1.8e9,"exp":{NOW + 30}}}'))
    add("iat exponent int-looking", text_claims(f'{{"aud":"{AUD}","iat":18E8,"exp":{NOW + 30}}}'))
    add("iat string", claims(aud=AUD, iat=str(NOW), exp=NOW + 30))
    add("iat null", claims(aud=AUD, iat=None, exp=NOW + 30))
    add("iat nan", text_claims(f'{{"aud":"{AUD}","iat":NaN,"exp":{NOW + 30}}}'))
    add("exp infinity", text_claims(f'{{"aud":"{AUD}","iat":{NOW},"exp":Infinity}}'))
    add("exp huge int", claims(aud=AUD, iat=NOW, exp=10**30))
    add("exp 2^63", claims(aud=AUD, iat=NOW, exp=2**63))
    add("exp 4300 digits", text_claims(f'{{"aud":"{AUD}","iat":{NOW},"exp":{"9" * 4300}}}'))
    add("exp 4301 digits", text_claims(f'{{"aud":"{AUD}","iat":{NOW},"exp":{"9" * 4301}}}'))
    add("iat huge int", claims(aud=AUD, iat=10**30, exp=10**30 + 30))
    add("iat huge negative", claims(aud=AUD, iat=-(10**30), exp=NOW))
    add("iat -0", text_claims(f'{{"aud":"{AUD}","iat":-0,"exp":{NOW}}}'))
    add("iat leading zero", text_claims(f'{{"aud":"{AUD}","iat":0{NOW},"exp":{NOW + 30}}}'))
    add("iat plus sign", text_claims(f'{{"aud":"{AUD}","iat":+{NOW},"exp":{NOW + 30}}}'))
    add("exp before iat", claims(aud=AUD, iat=NOW, exp=NOW - 100))
    add("long-lived", claims(aud=AUD, iat=NOW - 1000, exp=NOW + 1000))
    add("duplicate iat last wins", text_claims(f'{{"aud":"{AUD}","iat":1,"exp":{NOW + 30},"iat":{NOW}}}'))
    add("duplicate iat last loses", text_claims(f'{{"aud":"{AUD}","iat":{NOW},"exp":{NOW + 30},"iat":1}}'))
    add("negative epoch", claims(aud=AUD, iat=-5, exp=-1), now=-3.5)
    add("zero epoch", claims(aud=AUD, iat=0, exp=30), now=0.0)

    # aud.
    add("aud missing", claims(iat=NOW, exp=NOW + 30))
    add("aud null", claims(aud=None, iat=NOW, exp=NOW + 30))
    add("aud number", claims(aud=1, iat=NOW, exp=NOW + 30), audiences=("1",))
    add("aud list (python raises)", claims(aud=[AUD], iat=NOW, exp=NOW + 30))
    add("aud object (python raises)", claims(aud={"a": AUD}, iat=NOW, exp=NOW + 30))
    add("aud empty accepted", claims(aud="", iat=NOW, exp=NOW + 30), audiences=("",))
    add("aud escaped", text_claims(f'{{"aud":"sess\\u002d1","iat":{NOW},"exp":{NOW + 30}}}'))
    add("aud case differs", claims(aud="SESS-1", iat=NOW, exp=NOW + 30))
    add("aud duplicate last wins", text_claims(f'{{"aud":"x","iat":{NOW},"exp":{NOW + 30},"aud":"{AUD}"}}'))
    add("aud astral escaped pair", text_claims(f'{{"aud":"\\ud83d\\ude00","iat":{NOW},"exp":{NOW + 30}}}'), audiences=("\U0001f600",))

    # caller.
    base = {"aud": AUD, "iat": NOW, "exp": NOW + 30}
    for name, value in [
        ("caller null", None),
        ("caller number", 5),
        ("caller list", ["/a/b"]),
        ("caller bool", True),
        ("caller empty", ""),
        ("caller no slash", "abc"),
        ("caller root only", "/abc"),
        ("caller trailing slash", "/ns/"),
        ("caller deep", "/a/b/c"),
        ("caller plain", "/threads/x"),
        ("caller unicode", "/\u00e9/\U0001f600"),
    ]:
        add(name, claims(**base, caller=value))
    add("caller lone surrogate", text_claims(std_claims()[:-1] + ',"caller":"/ns/\\ud800"}'))
    add("caller surrogate pair", text_claims(std_claims()[:-1] + ',"caller":"/ns/\\ud83d\\ude00"}'))
    add("caller reversed pair", text_claims(std_claims()[:-1] + ',"caller":"/ns/\\ude00\\ud83d"}'))
    add("caller bad escape", text_claims(std_claims()[:-1] + ',"caller":"/ns/\\x41"}'))

    # depth.
    for name, value in [
        ("depth 0", 0),
        ("depth 7", 7),
        ("depth negative", -3),
        ("depth true", True),
        ("depth string", "1"),
        ("depth null", None),
        ("depth huge", 10**25),
        ("depth i64 max", I64_MAX),
        ("depth i64 min", I64_MIN),
    ]:
        add(name, claims(**base, caller="/n/i", depth=value))
    add("depth float", text_claims(std_claims()[:-1] + ',"caller":"/n/i","depth":1.0}'))
    add("depth exponent", text_claims(std_claims()[:-1] + ',"depth":1e0}'))
    add("depth without caller", claims(**base, depth=4))

    # acct.
    for name, value in [
        ("acct minimal", {"sub": "user-1"}),
        ("acct full", {"sub": "u", "scopes": ["b", "a", "b"], "claims": {"email": "u@x", "n": 1, "nested": {"l": [1, 2.5, None, True]}}}),
        ("acct empty scopes", {"sub": "u", "scopes": [], "claims": {}}),
        ("acct null", None),
        ("acct list", [{"sub": "u"}]),
        ("acct string", "u"),
        ("acct sub missing", {"scopes": []}),
        ("acct sub null", {"sub": None}),
        ("acct sub number", {"sub": 1}),
        ("acct scopes null", {"sub": "u", "scopes": None}),
        ("acct scopes string", {"sub": "u", "scopes": "a"}),
        ("acct scopes object", {"sub": "u", "scopes": {"a": 1}}),
        ("acct scopes with number", {"sub": "u", "scopes": ["a", 1]}),
        ("acct scopes nested", {"sub": "u", "scopes": [["a"]]}),
        ("acct claims null", {"sub": "u", "claims": None}),
        ("acct claims list", {"sub": "u", "claims": []}),
        ("acct claims string", {"sub": "u", "claims": "x"}),
        ("acct extra keys", {"sub": "u", "kind": "passport"}),
        ("acct claims big int", {"sub": "u", "claims": {"big": 2**64, "max": 2**64 - 1, "min": I64_MIN}}),
    ]:
        add(name, claims(**base, acct=value))
    add("acct claims nan", text_claims(std_claims()[:-1] + ',"acct":{"sub":"u","claims":{"x":NaN,"y":-Infinity,"z":1E400}}}'))
    add("acct with caller", claims(**base, caller="/n/i", acct={"sub": "u"}))
    add("acct with bad caller", claims(**base, caller="nope", acct={"sub": "u"}))
    add("acct bad with caller", claims(**base, caller="/n/i", acct={"sub": 1}))
    add("acct claims duplicate keys", text_claims(std_claims()[:-1] + ',"acct":{"sub":"u","claims":{"k":1,"k":2}}}'))

    # Extras are ignored, whatever they hold.
    add("extra claims", claims(**base, caller="/n/i", foo=[1, {"b": None}], nbf=NOW + 1000, iss="pinboard"))
    add("extra nan", text_claims(std_claims()[:-1] + ',"x":NaN,"y":Infinity,"z":-Infinity}'))
    add("extra float overflow", text_claims(std_claims()[:-1] + ',"x":1E400}'))
    add("extra deep nesting 100", text_claims(std_claims()[:-1] + ',"x":' + "[" * 100 + "]" * 100 + "}"))
    add("extra lone surrogates", text_claims(std_claims()[:-1] + ',"x":"\\udfff\\ud800"}'))
    add("extra non-string key", text_claims(std_claims()[:-1] + ",1:2}"))
    add("extra bad literal", text_claims(std_claims()[:-1] + ',"x":nul}'))
    add("extra big int", text_claims(std_claims()[:-1] + ',"x":' + "1" * 500 + "}"))
    add("extra too many digits", text_claims(std_claims()[:-1] + ',"x":-' + "1" * 4301 + "}"))

    out = []
    for name, token, secret, audiences, now in c:
        try:
            result = att.verify_attestation(token, secret=secret, audiences=set(audiences), now=now)
            python = "accepted" if result is not None else "refused"
        except Exception as exc:  # the Rust crate refuses what Python crashes on
            result = None
            python = f"raises {type(exc).__name__}"
        out.append(
            {
                "name": name,
                "token": token,
                "secret": secret,
                "audiences": audiences,
                "now": repr(float(now)),
                "python": python,
                "claims": rust_view(result),
                "caller": caller_view(result),
            }
        )
    names = [case["name"] for case in out]
    assert len(names) == len(set(names)), "duplicate case names"
    return out


# --- ids, segments, namespaces, epochs, bodies ---------------------------------------


def id_cases():
    ids = [
        "", "a", "A", "0", "-", ".", "..", "~", "_", "abc-DEF_123.~",
        "a" * 255, "a" * 256, "a" * 257, "~" * 256, " " * 257, "\u00e9" * 200,
        "\u00e9" * 256, "\u00e9" * 257, "\U0001f600" * 129, "a b", "a/b", "a+b",
        "a%20b", "a\x00", "a\n", "\u0661", "\uff21", "a\u00e9", "A" * 256 + "\u00e9",
    ]
    out = []
    for i in ids:
        out.append({"id": i, "detail": wire.invalid_id_reason(i)})
    return out


def segment_cases():
    raws = [
        "abc", "a%2Db", "%61%62%63", "%7e", "%7E", "a%20b", "a+b", "a%2Fb", "a%2fb", "%2F",
        "a%zz", "a%", "a%2", "%25", "%2525", "%C3%A9", "%c3%a9" * 257, "%FF", "%ff%fe",
        "%E2%82", "%E2%82%AC", "%ED%A0%80", "%F0%9F%98%80", "%F4%90%80%80", "%C0%AF",
        "%FF" * 256, "%FF" * 257, "%E2%82" * 257, "%61" * 256, "%61" * 257, "", "%00",
        "a" * 256, "~._-",
    ]
    out = []
    for raw in raws:
        decoded = unquote(raw)
        out.append(
            {
                "raw": raw,
                "decoded": decoded,
                # The reference decodes the whole path before routing, so a
                # decoded '/' ends the id segment there.
                "python_splits": "/" in decoded,
                "detail": wire.invalid_id_reason(decoded),
            }
        )
    return out


class _Api(pinned.PinnedAPI):
    pass


def namespace_message(ns: str):
    try:
        pinned.PinnedHost(_Api, worker=pinned.PinnedWorker(), namespace=ns)
    except ValueError as exc:
        return str(exc)
    return None


def namespace_cases():
    nss = [
        "/counter", "counter", "/a/b", "/", "", "/a b", "//", "/a/", "/\u00e9t\u00e9",
        "/a\tb", "/a\nb", "/\x1c", "/\x1f", "/\x85", "/\xa0", "/\u1680", "/\u2000", "/\u200a",
        "/\u200b", "/\u2028", "/\u2029", "/\u202f", "/\u205f", "/\u3000", "/\ufeff",
        "/a'b", '/a"b', "/a'\"b", "a'b", "/\\", "/\x00", "/\x7f", "/\U0001f600", "/a\x0bb",
        "/-_.~!@#$%^&*()", " /a", "a'\"b", "\x00 \x7f", "\u00ad \u200b \ufeff",
        "\U000e0001 x", "\ue000 x", "\u00e9 \u00fc", "\\ x", "\r \x1b",
    ]
    return [{"ns": ns, "error": namespace_message(ns)} for ns in nss]


def epoch_cases():
    values = [
        b"0", b"1", b"007", b"42", b"18446744073709551615", b"18446744073709551616",
        b"99999999999999999999999", b"", b" ", b" 1", b"1 ", b"+1", b"-1", b"1.0", b"1e3",
        b"0x10", b"1\n", b"\xd9\xa1", b"\xb2", b"abc", b"00000000000000000000000000000001",
    ]
    out = []
    for v in values:
        conn = types.SimpleNamespace(headers={wire.EPOCH_HEADER: v.decode("latin-1")}, scope={"type": "http"})
        try:
            py = wire._placement_epoch(conn)
        except HTTPException as exc:
            py = exc.detail
        out.append({"value": list(v), "python": py})
    return out


def body_cases():
    details = [
        "lease expired; not serving", "id must be non-empty", "malformed placement epoch",
        "namespace must be '/' plus a single path segment: '/a b'", 'q"uote', "back\\slash",
        "ctl \x00\x01\x08\t\n\x0c\r\x1f\x7f", "caf\u00e9 \U0001f600 \u2028", "",
    ]
    return [
        {"detail": d, "body": JSONResponse({"detail": d}).body.decode("utf-8")}
        for d in details
    ]


def main() -> None:
    attestation = {
        "reference": f"pinned {pinned.__version__ if hasattr(pinned, '__version__') else '0.16.0'}",
        "mint": mint_cases(),
        "verify": verify_cases(),
    }
    ids = {
        "ids": id_cases(),
        "segments": segment_cases(),
        "namespaces": namespace_cases(),
        "epochs": epoch_cases(),
        "detail_bodies": body_cases(),
    }
    for name, data in [("attestation.json", attestation), ("ids.json", ids)]:
        (OUT / name).write_text(json.dumps(data, indent=1, ensure_ascii=True) + "\n")
        print(f"wrote {name}", file=sys.stderr)


if __name__ == "__main__":
    main()
