#!/usr/bin/python3
"""A reference of GPT-2's byte-level BPE tokenizer, written from the algorithm of OpenAI's
encoder.py: GPT-2's pre-tokenizer pattern through the `regex` module (as GPT-2 ran it), bytes as
printable stand-ins (bytes_to_unicode), and the lowest-ranked adjacent pair merged, every
occurrence at once, until no pair has a rank. Where tiktoken or tokenizers is installed, `check`
compares with them too.

  gpt2_bpe.py make-fixture OUT_DIR
      learns 300 merges from a small text, writes vocab.json and merges.txt (the 256 byte tokens,
      then the merges, then <|endoftext|>), corpus.txt (Unicode in several scripts, digits of
      several kinds, white space runs, tabs, contractions, emoji never seen in training) and
      expected.json: the corpus's pieces and token ids by this reference;
      tests/unit/gpt2_tokenizer_test.cc reads them.
  gpt2_bpe.py encode TOKENIZER_DIR FILE
      the ids of FILE's text, one per line.

Run with Debian's interpreter and python3-regex: /usr/bin/python3 tests/reference/gpt2_bpe.py ...
"""
import collections
import json
import os
import sys

import regex

PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_CHAR = bytes_to_unicode()


def merge_pair(word, pair):
    """Every occurrence of the adjacent pair merged, left to right."""
    merged, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            merged.append(word[i] + word[i + 1])
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return merged


class Tokenizer:
    def __init__(self, directory):
        self.vocab = json.load(open(os.path.join(directory, "vocab.json"), encoding="utf-8"))
        lines = open(os.path.join(directory, "merges.txt"), encoding="utf-8").read().split("\n")
        merges = [tuple(l.split(" ")) for l in lines if l and not l.startswith("#version")]
        self.ranks = {m: i for i, m in enumerate(merges)}

    def bpe(self, piece):
        word = [BYTE_CHAR[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            pairs = set(zip(word, word[1:]))
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            word = merge_pair(word, best)
        return [self.vocab[s] for s in word]

    def encode(self, text):
        return [i for piece in PATTERN.findall(text) for i in self.bpe(piece)]


TRAINING = """The quick brown fox jumps over the lazy dog. It's the dog's day; they're sure we'll see
what you've done, and I'd say I'm not the one who said it. The theory then: the other three
thinkers thought that the thirty-three thieves there threw the things they had through the thick
thorns. 1234567890 12 345 6789 2024-11-25. Naïve café, résumé, über, straße. Ελληνικά, русский,
中文字符. """ * 3

CORPUS = (
    "Hello world! It's a test: we're here, you've seen it, they'll come, I'm sure, he'd go.\n"
    "Contractions in capitals are not split: IT'S, WE'RE; and quotes: 'single' \"double\".\n"
    "Runs of spaces:   three,    four, a tab\there, two tabs\t\tthere, trailing spaces   \n"
    "\n\n\nBlank lines above; carriage return\r\nand a form feed\x0c too.\n"
    "Unicode: naïve café résumé über straße Ελληνικά русский 中文字符 日本語のテキスト 한국어.\n"
    "Combining marks: e\u0301 a\u0308; non-breaking\u00a0space; ideographic\u3000space; em\u2003space.\n"
    "Numbers: 12345 3.14159 -42 1e10 \u0663\u0664\u0665 (Arabic-Indic) \u00b2\u00b3 \u216b \u2460.\n"
    "Emoji never seen in training: \U0001f642\U0001f680 and symbols \u00a9 \u2122 \u20ac 100.\n"
    "Punctuation runs: ...!!! ??? --- ;;; ''' \"\"\" end.   \n   "
)


def train(text, merges_wanted):
    words = collections.Counter(tuple(BYTE_CHAR[b] for b in p.encode("utf-8")) for p in PATTERN.findall(text))
    merges = []
    for _ in range(merges_wanted):
        pairs = collections.Counter()
        for w, n in words.items():
            for pair in zip(w, w[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        new_words = collections.Counter()
        for w, n in words.items():
            new_words[tuple(merge_pair(w, best))] += n
        words = new_words
    return merges


def make_fixture(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    merges = train(TRAINING, 300)
    vocab = {BYTE_CHAR[b]: i for i, b in enumerate(BYTE_CHAR)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab["<|endoftext|>"] = len(vocab)
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    with open(os.path.join(out_dir, "corpus.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(CORPUS)
    tok = Tokenizer(out_dir)
    with open(os.path.join(out_dir, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"pieces": PATTERN.findall(CORPUS), "ids": tok.encode(CORPUS)}, f, ensure_ascii=False, indent=0)
    check(out_dir, CORPUS)


def check(directory, text):
    """Compares with tokenizers where installed (tiktoken has no loader for other vocabularies)."""
    try:
        from tokenizers import Tokenizer as HfTokenizer, models, pre_tokenizers, decoders
    except ImportError:
        print("tokenizers not installed: compared with this reference only", file=sys.stderr)
        return
    hf = HfTokenizer(models.BPE.from_file(os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    same = hf.encode(text).ids == Tokenizer(directory).encode(text)
    print("tokenizers agrees" if same else "tokenizers DISAGREES", file=sys.stderr)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make-fixture":
        make_fixture(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "encode":
        text = open(sys.argv[3], encoding="utf-8", newline="").read()
        print("\n".join(map(str, Tokenizer(sys.argv[2]).encode(text))))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
