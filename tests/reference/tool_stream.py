"""A streamed chat answer put back together through the official `openai` client, for the scripts
that check tool calls (openai_strict_tools.py, xml_tool_calls.py)."""


def streamed_calls(client, **kwargs):
    """Streams `client.chat.completions.create(**kwargs)`: the finish reason, the calls as
    (name, arguments text) in index order, and the completion tokens."""
    finish, parts, used = None, {}, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.usage:
            used = chunk.usage.completion_tokens
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                part = parts.setdefault(d.index, ["", ""])
                part[0] += (d.function.name or "") if d.function else ""
                part[1] += (d.function.arguments or "") if d.function else ""
    return finish, [tuple(p) for _, p in sorted(parts.items())], used
