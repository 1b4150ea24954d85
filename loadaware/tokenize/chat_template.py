"""A chat template rendered as the engine renders it.

vLLM renders chat requests with transformers' `apply_chat_template`; this module reproduces its semantics
(transformers 4.45+ / 5.x, src/transformers/utils/chat_template_utils.py and
src/transformers/tokenization_utils_base.py):

- a jinja2 ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the `loopcontrols` extension,
  a `{% generation %}` block tag (its body, unchanged), the globals `raise_exception` (a TemplateError),
  `strftime_now(format)` (the current local time), `namespace` (refusing underscore-prefixed attributes) and
  `dict`, and a `tojson` filter that is
  `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)` with those keyword arguments
  exposed (jinja's own tojson escapes HTML characters);
- the variables `messages`, `tools`, `documents`, `add_generation_prompt`, the tokenizer's named special tokens
  (bos, eos, unk, sep, pad, cls, mask: only those set) and any extra keyword (they override the tokens);
- message keys whose value is None are dropped; a message's reasoning under `reasoning_content`, `thinking` or
  `reasoning` is also given under `thinking` and `reasoning_content`;
- `continue_final_message`: the final message's content (its last text part, for a list) gets a tag appended, the
  chat is rendered and cut at the tag, so the final message stays open (if the template trimmed the space after
  the tag, the cut text is right-stripped too). It cannot be combined with `add_generation_prompt`.

vLLM (vllm/entrypoints/chat_utils.py) decides per template whether message content is given as a string or as
OpenAI parts: a template that loops over a message's `content` gets parts ("openai"), any other gets the text
parts joined with newlines ("string"). Text parts are vLLM's TEXT_PART_TYPES: `text`, `input_text` and
`output_text` (under "text"), `refusal` and `thinking` (under their type's name), and plain strings; a `text` or
`refusal` part without its text is skipped. A message reaches the template with its role and content only, plus an
assistant's tool calls (arguments parsed from JSON strings into objects, an empty list dropped) and reasoning, a
tool message's tool_call_id, and a string name; a None content is no parts ("" or []). Tools are dumped from
vLLM's pydantic models: {"type", "function": {"name", "description", "parameters"}}, None where absent. vLLM
then tokenizes the rendered text without adding special tokens (the template placed them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

ContentFormat = Literal["string", "openai"]
Clock = Callable[[], datetime]

# The named special tokens transformers passes to the template (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(Exception):
    """The chat could not be rendered (the template raised, or the input does not fit it)."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _TemplateDict:
    """`dict(...)` in a template, without exposing the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a namespace cannot hold the underscore-prefixed attribute {name!r}")


class _Namespace(jinja2.utils.Namespace):
    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's signature: namespace(self=...) works
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks the assistant's tokens with it (for training
    masks); rendering, it is its body unchanged."""

    tags = {"generation"}  # noqa: RUF012 - jinja's Extension declares it a plain set

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


def make_environment(clock: Clock = datetime.now) -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: clock().strftime(fmt)
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


# ---- content format, as vLLM detects it ----
def _is_content_access(node: jinja2.nodes.Node, names: set[str]) -> bool:
    if isinstance(node, jinja2.nodes.Getattr):
        return node.attr == "content" and isinstance(node.node, jinja2.nodes.Name) and node.node.name in names
    if isinstance(node, jinja2.nodes.Getitem):
        arg = node.arg
        return (isinstance(arg, jinja2.nodes.Const) and arg.value == "content"
                and isinstance(node.node, jinja2.nodes.Name) and node.node.name in names)
    return False


def _accesses(node: jinja2.nodes.Node, names: set[str]) -> bool:
    """`node` is one of `names`, or a slice, filter or test of it (messages[1:], messages | reverse)."""
    while isinstance(node, (jinja2.nodes.Getitem, jinja2.nodes.Filter, jinja2.nodes.Test)):
        if isinstance(node, jinja2.nodes.Getitem) and not isinstance(node.arg, jinja2.nodes.Slice):
            return False
        if node.node is None:
            return False
        node = node.node
    return isinstance(node, jinja2.nodes.Name) and node.name in names


def detect_content_format(ast: jinja2.nodes.Template) -> ContentFormat:
    """'openai' when the template loops directly over a message's content, as vLLM decides it: a message is the
    target of a loop over `messages` (or over a variable set from it, like loop_messages = messages[1:])."""
    lists = {"messages"}
    for assign in ast.find_all(jinja2.nodes.Assign):
        if isinstance(assign.target, jinja2.nodes.Name) and _accesses(assign.node, lists):
            lists.add(assign.target.name)
    message_vars: set[str] = set()
    for loop in ast.find_all(jinja2.nodes.For):
        if _accesses(loop.iter, lists) and isinstance(loop.target, jinja2.nodes.Name):
            message_vars.add(loop.target.name)
    for loop in ast.find_all(jinja2.nodes.For):
        if _is_content_access(loop.iter, message_vars):
            return "openai"
    return "string"


# vLLM's text part types (renderers/chat_utils.py TEXT_PART_TYPES) and the key each keeps its text under.
TEXT_PART_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
                  "thinking": "thinking"}
_SKIP_NONE_TYPES = ("text", "refusal")  # vLLM's PART_TYPES_TO_SKIP_NONE_CONTENT (of the text types)


def _part(p: Any) -> tuple[str, Any]:
    """One content part as vLLM parses it: ("text", its text) for a string or a text-type part (the value under the
    type's key), ("skip", None) for a `text`/`refusal` part without one, else ("other", the part)."""
    if isinstance(p, str):
        return "text", p
    if isinstance(p, dict) and p.get("type") in TEXT_PART_KEYS:
        value = p.get(TEXT_PART_KEYS[p["type"]])
        if value is None and p["type"] in _SKIP_NONE_TYPES:
            return "skip", None
        return "text", value
    return "other", p


def _content(content: Any, fmt: ContentFormat) -> Any:
    if content is None:  # vLLM: no parts, so "" for a string template and [] for an openai one
        return "" if fmt == "string" else []
    if not isinstance(content, list):
        return content
    parsed = [_part(p) for p in content]
    if fmt == "string":  # vLLM: the text parts, joined with newlines
        texts = [value for kind, value in parsed if kind == "text"]
        if not all(isinstance(t, str) for t in texts):
            raise ChatTemplateError("a text content part holds no string")  # vLLM's join fails: no request
        return "\n".join(texts)
    parts: list[dict[str, Any]] = []
    for kind, value in parsed:
        if kind == "text":
            parts.append({"type": "text", "text": value})
        elif kind == "other" and isinstance(value, dict) and isinstance(value.get("type"), str):
            parts.append({"type": value["type"].removesuffix("_url")})  # image_url -> image: the media stay out
    return parts


def _tool_calls(calls: list[Any]) -> list[Any]:
    # vLLM: tool-call arguments reach the template as JSON objects, not the OpenAI API's JSON strings
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            args = function.get("arguments")
            if not args:
                args = {}
            elif not isinstance(args, (dict, list)):
                try:
                    args = json.loads(args)
                except ValueError as exc:
                    raise ChatTemplateError(f"tool call arguments are not JSON: {exc}") from exc
            call = {**call, "function": {**function, "arguments": args}}
        out.append(call)
    return out


def _message(m: Mapping[str, Any], fmt: ContentFormat) -> dict[str, Any]:
    """One message as vLLM hands it to transformers (role, content, and per role its tool calls, tool call id,
    name, reasoning: nothing else of the request's message), then as transformers gives it to the template."""
    out: dict[str, Any] = {"role": m.get("role"), "content": _content(m.get("content"), fmt)}
    if m.get("role") == "assistant":
        calls = m.get("tool_calls")
        if isinstance(calls, list) and calls:
            out["tool_calls"] = _tool_calls(calls)
        reasoning = m.get("reasoning", m.get("reasoning_content"))
        if reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = reasoning
    elif m.get("role") == "tool" and "tool_call_id" in m:
        out["tool_call_id"] = m["tool_call_id"]
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    out = {k: v for k, v in out.items() if v is not None}  # transformers drops None values
    reasoning = next((out[k] for k in _REASONING_FIELDS if out.get(k) is not None), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


def vllm_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Tools as vLLM hands them over: each request tool is parsed into its pydantic model and dumped, so a
    function has name, description and parameters in that order (None when absent), then any extra keys."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ChatTemplateError("tools must be a list")
    out = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ChatTemplateError("a tool needs a function with a name")
        fn = {"name": function["name"], "description": function.get("description"),
              "parameters": function.get("parameters"),
              **{k: v for k, v in function.items() if k not in ("name", "description", "parameters")}}
        out.append({"type": tool.get("type", "function"), "function": fn,
                    **{k: v for k, v in tool.items() if k not in ("type", "function")}})
    return out


def requires_system_first(source: str | None) -> bool:
    """vLLM's Anthropic Messages endpoint (AnthropicServingMessages._detect_merge_inline_system): a template
    requires system-first ordering when rendering [system, user, system, user] in a PLAIN sandboxed environment
    (no transformers globals, no generation tag) without a generation prompt raises a TemplateError, or when
    there is no template. Any other exception would stop vLLM at start; here it counts as no."""
    if not source:
        return True
    try:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.from_string(source).render(messages=[
            {"role": "system", "content": "t"}, {"role": "user", "content": "t"},
            {"role": "system", "content": "t"}, {"role": "user", "content": "t"}], add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    except Exception:  # noqa: BLE001 - a template is code from the model's repository
        return False
    return False


def _system_text(content: Any) -> str:
    """A system message's text as vLLM's Messages endpoint extracts it (a list: its text parts, joined with "")."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str))
    return ""


def merge_inline_system(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Every system message's text joined with "" in order into one leading system message (none when that text
    is empty), the other messages after it as they were: vLLM's Messages endpoint for a system-first template
    (the top-level system first, then the inline ones; the router's parser puts the top-level one first)."""
    text = "".join(_system_text(m.get("content")) for m in messages if m.get("role") == "system")
    rest = [m for m in messages if m.get("role") != "system"]
    return [{"role": "system", "content": text}, *rest] if text else rest


def _json_copy(value: Any) -> Any:
    """What the template sees is plain JSON data, never the caller's objects."""
    return json.loads(json.dumps(value))


# Values a JSON round trip returns as they are (exact types: a subclass is copied through JSON).
_SCALARS = frozenset({str, bool, type(None)})  # not int: past 4,300 digits JSON refuses one


def _copy_messages(messages: Sequence[Any]) -> list[Any]:
    """_json_copy of the messages, one at a time: a flat message (a dict of strings to strings, booleans or nulls:
    the common chat turn) by a shallow copy, which is what the round trip gives for it without serializing
    its text (a 220 KB history costs ~1 ms through JSON); anything else through JSON."""
    out = []
    for m in messages:
        if type(m) is dict and all(type(k) is str and type(v) in _SCALARS for k, v in m.items()):
            out.append(dict(m))
        else:
            out.append(_json_copy(m))
    return out


class ChatTemplate:
    def __init__(self, source: str, special_tokens: Mapping[str, str | None] | None = None,
                 clock: Clock = datetime.now) -> None:
        env = make_environment(clock)
        self.source = source
        try:
            ast = env.parse(source)
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self.content_format: ContentFormat = detect_content_format(ast)
        self.requires_system_first = requires_system_first(source)  # vLLM's Messages endpoint merges system text
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if isinstance(v, str)}

    def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
               documents: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = True,
               continue_final_message: bool = False, extra: Mapping[str, Any] | None = None) -> str:
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError("continue_final_message and add_generation_prompt are not compatible")
        try:
            chat = [_message(m, self.content_format) for m in _copy_messages(messages)]
        except ChatTemplateError:
            raise
        except (TypeError, ValueError, AttributeError) as exc:
            raise ChatTemplateError(f"messages are not JSON objects: {exc}") from exc
        final: str | None = None
        if continue_final_message:
            final = self._tag_final(chat)
        kwargs = {**self.special_tokens, **_json_copy(dict(extra or {}))}
        try:
            text = self._template.render(messages=chat, tools=_json_copy(vllm_tools(tools)),
                                         documents=_json_copy(documents),
                                         add_generation_prompt=add_generation_prompt, **kwargs)
        except ChatTemplateError:
            raise
        except Exception as exc:  # a template is code from the model's repository
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
        if final is not None:
            text = self._cut_at_tag(text, final)
        return text

    @staticmethod
    def _tag_final(chat: list[dict[str, Any]]) -> str:
        if not chat:
            raise ChatTemplateError("continue_final_message with no message")
        last = chat[-1]
        content = last.get("content")
        if content is None:
            raise ChatTemplateError("continue_final_message: the final message has no content")
        if isinstance(content, list):
            for part in reversed(content):
                if isinstance(part, dict) and "text" in part:
                    final = str(part["text"])
                    part["text"] = final + _CONTINUE_TAG
                    return final
            raise ChatTemplateError("continue_final_message: the final message has no text to continue")
        final = str(content)
        last["content"] = final + _CONTINUE_TAG
        return final

    @staticmethod
    def _cut_at_tag(text: str, final: str) -> str:
        tag = _CONTINUE_TAG.strip()
        if final.strip() not in text or tag not in text:
            raise ChatTemplateError("continue_final_message: the template dropped part of the final message")
        at = text.rindex(tag)
        if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            return text[:at]
        return text[:at].rstrip()


def read_tokenizer_config(folder: str) -> tuple[str | None, dict[str, str | None]]:
    """The chat template (chat_template.jinja beside the config wins, as in transformers; of named templates
    the "default") and the named special tokens, from a tokenizer folder."""
    import os

    config: dict[str, Any] = {}
    path = os.path.join(folder, "tokenizer_config.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as fh:
            template = fh.read()
    specials: dict[str, str | None] = {}
    for key in SPECIAL_TOKEN_NAMES:
        value = config.get(key)
        if isinstance(value, dict):  # an AddedToken written out: {"content": ..., "lstrip": ...}
            value = value.get("content")
        specials[key] = value if isinstance(value, str) else None
    return (template if isinstance(template, str) else None), specials
