"""Deterministic test corpus for the tokenizer oracle test.

make_corpus(specials) returns a list of byte strings (>= 1,000): hand-written
cases (many scripts, code, emoji, whitespace runs, digits, contractions,
Unicode spaces, combining marks, text around special tokens, invalid UTF-8)
and generated mixtures of them drawn with a fixed seed, so every run and every
machine tests the same strings. `specials` are the vocabulary's special-token
texts, spliced into some strings.

Run as a script to write the corpus as records of u32 length + bytes:
    python3 tok_corpus.py OUT.bin ['<|im_start|>' ...]
"""
import random
import struct
import sys

FIXED = [
    "Hello world's café 12345 日本語\n\n",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done it; he'd said she's RIGHT, it'S I'LL WE'VE",
    "don’t won’t it’s — “quoted” ‘single’ «guillemets» „German“",
    "Ünïcödé ñandú façade naïve coöperate Ærøskøbing Straße ß ẞ",
    "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Γειά σου Κόσμε· ξεσκεπάζω την ψυχοφθόρα βδελυγμία",
    "مرحبا بالعالم، هذا نص عربي مع أرقام ١٢٣٤٥ و 678",
    "שלום עולם! זהו טקסט בעברית.",
    "नमस्ते दुनिया, यह हिंदी पाठ है। क्षत्रिय",
    "ওহে বিশ্ব, এটি বাংলা লেখা।",
    "สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "你好，世界！这是一个中文句子，包含标点符号。",
    "こんにちは世界。カタカナとひらがなと漢字を混ぜた文です。ｶﾀｶﾅ",
    "안녕하세요 세계! 한국어 문장입니다.",
    "Xin chào thế giới, đây là tiếng Việt có dấu.",
    "İstanbul'da ılık bir gün; I ı İ i",
    "Ελληνικά, Русский, 中文, العربية, हिन्दी in one line",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇺🇸🇯🇵 ❤️ 🏳️‍🌈 ✈︎ 1️⃣",
    "🤖🤖🤖 robots   and    spaces",
    "math: ∑_{i=1}^{n} x_i² ≤ ∞, ∀x ∈ ℝ, √2 ≈ 1.41421356, π·r², ≠ ≥ ∂",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(12))\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    '{"key": [1, 2.5, -3e10, true, null], "nested": {"a": "b\\u00e9"}}',
    "<html><body class=\"x\"><p>Hello&nbsp;&amp;&lt;world&gt;</p></body></html>",
    "for i in $(seq 1 10); do echo \"$i\" | grep -E '^[0-9]+$' >> /tmp/out.log; done",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC LIMIT 10;",
    "    indented four spaces\n        eight spaces\n\t\ttwo tabs\n",
    "a  b   c    d     e      f       g",
    "trailing spaces   ",
    "   leading spaces",
    "\n\n\n\nnewlines\n\n\n",
    "\r\nwindows\r\nline\r\nendings\r\n",
    "\t\t\t",
    " ",
    "  ",
    "\n",
    "",
    "a",
    "0",
    "1234567890 12345678901234567890 3.14159 -42 +7 1,000,000 1.000.000,00",
    "phone: +1 (555) 123-4567, date 2024-01-31T12:34:56Z, ip 192.168.0.1",
    "v1.2.3-rc.4+build.567 0x1F 0b1010 1e-9 1_000_000",
    "non\u00a0breaking\u2009thin\u3000ideographic\u2028line\u2029para\u0085nel\u200bzwsp\u180emvs",
    "combining: e\u0301 a\u0308 o\u0302 n\u0303 A\u030a \u1e9b\u0323 Hangul jamo \u1100\u1161\u11a8",
    "decomposed café vs composed café",
    "ſ long s: 'ſ 'S 'ſt",
    "ﬁ ﬂ ligatures, ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ，１２３",
    "Zalgo: Z̴̡̢a̶̛l̷̨g̸o̵ text",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝓈𝒸𝓇𝒾𝓅𝓉 letters and 𐍈 Gothic 𓀀 hieroglyph",
    "!!!???...,,,;;;:::---___===+++***&&&%%%$$$###@@@",
    "a'b'c' 'd 'e' ''",
    "http://example.com/path?query=1&b=2#frag https://xn--bcher-kva.example/ ",
    "mixed\ttabs \t and\t\tspaces \t\t ",
    "x" * 300,
    " " * 200 + "end",
    "\n" * 50,
    "ab" * 150,
    "1" * 100,
    "日本" * 80,
    "😀" * 40,
]

# Pools for random mixtures.
WORDS = [
    "the", "of", "and", "tokenizer", "merge", "byte", "pair", "encoding", "Hello", "WORLD", "It's", "they're",
    "café", "naïve", "Straße", "мир", "Привет", "κόσμε", "世界", "日本語", "テスト", "한국어", "नमस्ते", "مرحبا",
    "שלום", "ภาษาไทย", "Việt", "İstanbul", "😀", "👍🏽", "🇯🇵", "∑", "√2", "π", "x²", "def", "return", "{", "}",
    "(", ")", "[", "]", ";", "->", "=>", "==", "!=", "<=", "</div>", "<br/>", "&amp;", "#include", "0x7f", "42",
    "3.14", "1,000", "2024", "000", "9999999", "'s", "'LL", "’re", "--", "...", "…", "—", "\u00a0", "\u3000",
    "e\u0301", "ﬁ", "ＡＢＣ", "𝔘", "\\n", "\\t", "\"quoted\"", "'single'", "snake_case", "camelCase", "HTTPServer",
    "URL", "iPhone", "McDonald's", "O'Neil", "rock'n'roll",
]
SEPARATORS = [" ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "", "", ", ", ". ", " \n", "\t\t", " \t "]
RANGES = [  # code point blocks for random characters (no private use, no surrogates)
    (0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
    (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x22FF), (0x3040, 0x30FF),
    (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF),
    (0x1D400, 0x1D4FF),
]
INVALID = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc0\xaf", b"\xc3", b"\xe6\x97", b"\xf0\x9f\x98",
           b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe0\x80\x80", b"\xc3\x28", b"\xf8\x88\x80\x80\x80"]


def _random_chars(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(RANGES)
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0x41
        out.append(chr(cp))
    return "".join(out)


def _mixture(rng, specials):
    parts = []
    for _ in range(rng.randint(1, 14)):
        r = rng.random()
        if r < 0.55:
            parts.append(rng.choice(WORDS))
        elif r < 0.70:
            parts.append(_random_chars(rng, rng.randint(1, 8)))
        elif r < 0.80:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
        elif r < 0.88 and specials:
            parts.append(rng.choice(specials))
        else:
            parts.append(rng.choice(FIXED)[: rng.randint(0, 40)])
        parts.append(rng.choice(SEPARATORS))
    return "".join(parts)


def make_corpus(specials=(), n_random=1100, seed=20240531):
    specials = [s for s in specials if s]
    rng = random.Random(seed)
    out = [s.encode("utf-8") for s in FIXED]
    for s in specials[:40]:  # each special alone, glued to text, and doubled
        out.append(s.encode())
        out.append(("Hello" + s + "world").encode())
        out.append((" " + s + " \n" + s + s + "x").encode())
    for _ in range(n_random):
        out.append(_mixture(rng, specials).encode("utf-8"))
    # invalid UTF-8: bytes that are no character, inside and around text
    for i in range(120):
        base = _mixture(rng, specials).encode("utf-8")
        cut = rng.randint(0, len(base))
        bad = rng.choice(INVALID)
        if i % 3 == 0:  # cut a valid multi-byte character in half
            enc = rng.choice(["é", "日", "😀", "Ж"]).encode()
            bad = enc[: rng.randint(1, len(enc) - 1)]
        out.append(base[:cut] + bad + base[cut:])
    out.append(b"\xff\xfe\xfd")
    out.append(b"abc\x80def\xc3")
    out.append(bytes(range(256)))
    return out


def write_corpus(path, corpus):
    with open(path, "wb") as f:
        for s in corpus:
            f.write(struct.pack("<I", len(s)))
            f.write(s)


if __name__ == "__main__":
    c = make_corpus(sys.argv[2:])
    write_corpus(sys.argv[1], c)
    print(f"{len(c)} strings, {sum(map(len, c))} bytes")
