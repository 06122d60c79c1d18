"""Streams a chat completion through prefixgate with the official OpenAI Python client.

Usage: python3 tests/openai_stream.py BASE_URL MODEL
(BASE_URL like http://127.0.0.1:8080/v1). Exits non-zero on any failure. Run by the ignored
test `openai_python_client_streams` in tests/tests/streaming.rs (needs `pip install openai`).
"""

import sys

import openai


def main() -> int:
    base_url, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello"}],
        stream=True,
        max_tokens=8,
        extra_headers={"routing-strategy": "prefix-cache"},
    )
    pod = raw.headers.get("target-pod")
    text = ""
    finish = None
    for chunk in raw.parse():
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    print(f"target-pod={pod} finish={finish} text={text!r}")
    if not pod or not text or finish is None:
        return 1
    try:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        return 1
    except openai.NotFoundError as error:
        print(f"unknown model -> {error.status_code} {error.body}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
