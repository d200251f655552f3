"""demo-infer: deterministic "generation". The same prompt, max_tokens, temperature and seed
always give the same output, which is what makes results cacheable."""

import hashlib
import json
import sys

from gpuplatform_job import output_dir, params, report_progress

WORDS = (
    "the a GPU job runs fast slow model token cluster node queue fair share tier wait start".split()
)


def generate(prompt: str, max_tokens: int, temperature: float, seed: int | None) -> str:
    digest = hashlib.sha256(json.dumps([prompt, temperature, seed]).encode()).digest()
    words = []
    for i in range(max_tokens):
        digest = hashlib.sha256(digest + i.to_bytes(4, "big")).digest()
        words.append(WORDS[digest[0] % len(WORDS)])
    return " ".join(words)


def main() -> int:
    p = params()
    text = generate(p["prompt"], p.get("max_tokens", 32), p.get("temperature", 0), p.get("seed"))
    (output_dir() / "output.json").write_text(json.dumps({"prompt": p["prompt"], "text": text}))
    report_progress(1.0)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
