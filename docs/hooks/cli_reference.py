"""MkDocs hook: the command-line reference, generated from the ``dataservice`` command's own argparse
parsers (``dataservice.cli.build_parser``), so that the page cannot drift from the code.

A page holding the line ``<!-- cli-reference -->`` gets, in its place, a section per subcommand: its
description, its usage line, and each option with its help text and default.

Example (what ``dataservice health`` becomes)::

    ## dataservice health
    Ask a server's standard gRPC health service ...
    ```text
    usage: dataservice health [-h] [--service NAME] ... address
    ```
    - `address`: host:port of the dispatcher or worker ...
"""

from __future__ import annotations

import argparse
import html

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' hook signature)
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_reference())


def cli_reference() -> str:
    """The Markdown of every subcommand of ``dataservice``."""
    from dataservice.cli import build_parser

    parser = build_parser()
    sections = [_options(parser, "dataservice")]
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in subcommands._choices_actions}
    for name, sub in subcommands.choices.items():
        text = sub.description or helps.get(name) or ""
        sections.append(f"## dataservice {name}\n\n{_escape(text)}\n\n{_options(sub, f'dataservice {name}')}")
    return "\n\n".join(sections)


def _options(parser: argparse.ArgumentParser, prog: str) -> str:
    parser.prog = prog
    usage = parser.format_usage().strip()
    formatter = parser._get_formatter()
    lines = [f"```text\n{usage}\n```", ""]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else " " + formatter._format_args(action, action.dest.upper())
            name = ", ".join(f"`{option}{metavar}`" for option in action.option_strings)
        else:
            name = f"`{formatter._format_args(action, action.dest)}`"
        help_text = _escape(formatter._expand_help(action)) if action.help else ""
        lines.append(f"- {name}: {help_text}".rstrip(": "))
    return "\n".join(lines)


def _escape(text: str) -> str:
    """argparse help as Markdown text: one paragraph, no HTML (``<dir>`` stays visible)."""
    return html.escape(" ".join(text.split()), quote=False)
