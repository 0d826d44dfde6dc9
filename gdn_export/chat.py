"""Multi-turn chat over a ``Session``: each turn feeds only its new text, never the history again.

The checkpoint's chat template (``chat_template.jinja`` or the
``chat_template`` of ``tokenizer_config.json``, beside the tokenizer) says how
a conversation is written out. A turn's text is what the template writes after
the last reply: the end of that reply's turn, the user's message and the
assistant's generation prompt. It is found by rendering the conversation with
a marker in place of the last reply and taking what follows the marker, so it
does not depend on how the template rewrites earlier replies (Qwen3's drops
their reasoning). The state already holds every earlier token, as generated.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from gdn_export.runner import Generation, RunnerError, check_prompt_fits
from gdn_export.session import Session

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# Stands for the last reply while a turn's text is rendered; no template writes it.
REPLY_MARKER = "\x00gdn-export reply\x00"


def _special_token(value) -> str:
    """A tokenizer_config.json special token: a string or an AddedToken dict ({"content": ...})."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


class ChatTemplate:
    """A Hugging Face chat template (Jinja), rendered as transformers renders it."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = ""):
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        environment.globals["raise_exception"] = raise_exception
        environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
        self.template = environment.from_string(source)
        self.special = {"bos_token": bos_token, "eos_token": eos_token}

    def render(self, messages: list, *, add_generation_prompt: bool) -> str:
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt, **self.special)

    def turn_text(self, messages: list, user_text: str) -> str:
        """The text to feed for the user's message ``user_text`` after ``messages`` (the conversation so far,
        ending with an assistant reply, or empty), up to the assistant's generation prompt."""
        user = {"role": "user", "content": user_text}
        if not messages:
            return self.render([user], add_generation_prompt=True)
        marked = [*messages[:-1], {"role": "assistant", "content": REPLY_MARKER}, user]
        text = self.render(marked, add_generation_prompt=True)
        return text[text.rindex(REPLY_MARKER) + len(REPLY_MARKER):]


def load_chat_template(tokenizer_path) -> ChatTemplate:
    """The chat template beside ``tokenizer_path`` (the checkpoint's tokenizer.json); RunnerError if none."""
    import jinja2

    folder = Path(tokenizer_path).parent
    config_file, template_file = folder / TOKENIZER_CONFIG_FILE, folder / TEMPLATE_FILE
    config = {}
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise RunnerError(f"--chat: cannot read {config_file} ({error})") from None
    source = template_file.read_text() if template_file.is_file() else config.get("chat_template")
    if isinstance(source, list):  # several named templates: the default one
        source = next((entry.get("template") for entry in source if entry.get("name") == "default"), None)
    if not isinstance(source, str) or not source:
        raise RunnerError(f"--chat needs the checkpoint's chat template: none in {template_file} or {config_file}")
    try:
        return ChatTemplate(
            source, bos_token=_special_token(config.get("bos_token")), eos_token=_special_token(config.get("eos_token"))
        )
    except jinja2.exceptions.TemplateError as error:
        raise RunnerError(f"--chat: the chat template of {folder} does not compile ({error})") from None


class Chat:
    """A conversation of user messages and generated replies over ``session``, one turn at a time."""

    def __init__(self, session: Session, tokenizer, template: ChatTemplate):
        self.session, self.tokenizer, self.template = session, tokenizer, template
        # The messages the template sees; a conversation restored from a state file has earlier turns
        # whose text is not kept, which an empty exchange stands for.
        self.messages = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}] if session.tokens else []

    def turn_tokens(self, user_text: str) -> list:
        """The tokens to feed for ``user_text``: its turn's text, less an end-of-turn token already generated."""
        text = self.template.turn_text(self.messages, user_text)
        pending = self.session.pending_tokens
        if pending and pending[-1] in self.session.eos_ids:
            generated_end = self.tokenizer.id_to_token(pending[-1])
            text = text.removeprefix(generated_end)
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def say(self, user_text: str, *, max_new_tokens: int, **sampling) -> Generation:
        """Feed the user's message and generate the reply (until an end-of-sequence token or the budget);
        ``sampling`` is ``Session.respond``'s temperature, on_token and generator."""
        tokens = self.turn_tokens(user_text)
        check_prompt_fits(self.session.program, len(tokens), len(self.session.tokens), what="the message")
        result = self.session.respond(tokens, max_new_tokens=max_new_tokens, **sampling)
        reply = [token for token in result.tokens if token not in self.session.eos_ids]
        self.messages += [
            {"role": "user", "content": user_text},
            {"role": "assistant", "content": self.tokenizer.decode(reply, skip_special_tokens=True)},
        ]
        return result


def run_chat(program, tokenizer, args, console) -> int:
    """gdn-run --chat: a message per line of stdin, each reply streamed to stdout; EOF ends (and saves the
    state with --save-state), Ctrl-C ends writing nothing."""
    import sys

    from gdn_export.runner import TextStream
    from gdn_export.session import naming, seeded_generator

    template = load_chat_template(args.tokenizer)
    session = Session(program)
    if args.load_state:
        with naming("--load-state"):
            session.load(args.load_state)
    chat = Chat(session, tokenizer, template)
    generator = seeded_generator(args.seed)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        if not line.strip():
            continue
        stream = TextStream(tokenizer)

        def show(token: int) -> None:
            if token not in session.eos_ids:
                print(stream.push(token), end="", flush=True)

        chat.say(line.rstrip("\n"), max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                 on_token=show, generator=generator)
        print(flush=True)
    if args.save_state and session.position:
        with naming("--save-state"):
            session.save(args.save_state)
    return 0
