"""Streams a chat completion straight from one mock-engine replica with the official OpenAI
Python client, as a user of a vLLM replica would (no gateway in between).

Usage: python3 tests/python/stream_direct.py BASE_URL MODEL
(BASE_URL like http://127.0.0.1:8000/v1). Exits non-zero on any failure; prints what it saw.
Run by the ignored test `openai_python_client_streams_from_a_mock_engine` in
tests/tests/streaming.rs, which `.ci/run` runs with a virtual environment it creates.
"""

import sys

import openai


def main() -> int:
    base_url, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)

    # Streaming, with the usage chunk vLLM sends for stream_options.include_usage.
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello"}],
        stream=True,
        max_tokens=8,
        stream_options={"include_usage": True},
    )
    text, finish, usage, chunks = "", None, None, 0
    for chunk in stream:
        chunks += 1
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    print(f"chunks={chunks} finish={finish} usage={usage} text={text!r}")
    if not text or finish is None or usage is None or usage.completion_tokens < 1:
        print("stream incomplete: no text, no finish_reason or no usage", file=sys.stderr)
        return 1

    # The same request without streaming parses into the client's types.
    completion = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello"}], max_tokens=4
    )
    print(f"non-stream finish={completion.choices[0].finish_reason} usage={completion.usage}")
    if not completion.choices[0].message.content:
        print("non-stream answer has no content", file=sys.stderr)
        return 1

    # vLLM's 404 for a model the replica does not serve becomes the client's NotFoundError.
    try:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        print("unknown model was accepted", file=sys.stderr)
        return 1
    except openai.NotFoundError as error:
        print(f"unknown model -> {error.status_code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
