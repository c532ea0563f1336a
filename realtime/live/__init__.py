"""OpenAI's GPT-Live protocol (full-duplex voice, `client.live` in the `openai` SDK),
served by Parley's pipelines."""
