#!/usr/bin/env python3
"""Renders every template of templates.json for a set of conversations with
transformers' own chat-template renderer (render_jinja_template, what
tokenizer.apply_chat_template calls: jinja2's ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks, loopcontrols, its json.dumps tojson,
raise_exception and strftime_now), and writes reference.json, which
tests/unit/test_jinja_reference.c compares kiln's interpreter with byte for byte.

Like apply_chat_template it passes bos_token and eos_token (the tokenizer's
special tokens), tools=None and documents=None. A render that raises is
recorded as {"error": ...}: kiln must fail on it too.

Run in the project's venv with transformers and jinja2 installed:
    .venv/bin/python tests/data/chat/make_reference.py
"""
import json
import os

import jinja2
import transformers
from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": " Hello! How can I help? "},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "system_multi": [
        {"role": "system", "content": "  Answer in French.\n"},
        {"role": "user", "content": "Good morning"},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "How are you?"},
    ],
    "unicode": [{"role": "user", "content": "  Ça va? 日本語 😀 \"quoted\" 'single'\n\t"}],
    "bad_roles": [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
    ],
}


def main():
    with open(os.path.join(HERE, "templates.json"), encoding="utf-8") as f:
        templates = json.load(f)["templates"]
    cases = []
    for t in templates:
        for conv_name, conv in CONVERSATIONS.items():
            for gen in (False, True):
                case = {"template": t["name"], "conversation": conv_name, "add_generation_prompt": gen}
                kwargs = dict(t.get("extra", {}))
                try:
                    out, _ = render_jinja_template(
                        conversations=[conv],
                        chat_template=t["template"],
                        add_generation_prompt=gen,
                        bos_token=t["bos_token"],
                        eos_token=t["eos_token"],
                        **kwargs,
                    )
                    case["output"] = out[0]
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
    ref = {
        "generator": "tests/data/chat/make_reference.py: transformers %s render_jinja_template, jinja2 %s"
        % (transformers.__version__, jinja2.__version__),
        "conversations": CONVERSATIONS,
        "cases": cases,
    }
    with open(os.path.join(HERE, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("%d cases, %d errors" % (len(cases), sum("error" in c for c in cases)))


if __name__ == "__main__":
    main()
