"""Byte-level BPE pieces shared by the scripts and tests that turn tiktoken-style
ranks into HuggingFace tokenizer.json files (scripts/make_o200k_vocab.py,
tests/oracle/test_tokenizer_oracle.py) or write tokenizer seeds
(fuzz/make_tokenizer_seeds.py)."""


def bytes_to_unicode():
    """GPT-2's byte -> printable character map of byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def recover_merges(ranks, strict=True):
    """Each multi-byte token's merge (a pair of byte strings), in rank order,
    recovered as transformers' TikTokenConverter does: BPE on the token's bytes
    using only ranks below its own. A token with no such path raises
    SystemExit when strict, else is left out."""
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) == 1:
            continue
        parts = [bytes([x]) for x in tok]
        while len(parts) > 2:
            best, bi = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
        elif strict:
            raise SystemExit(f"token {tok!r} (rank {rank}): no merge path")
    return merges
