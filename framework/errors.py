"""The typed errors a user can meet. The CLI turns each into one paragraph and a non-zero exit."""

import re


class PipelabError(Exception):
    """Base class of every error pipelab raises on purpose."""

    exit_status = 2  # bad input; an error of a run that started may say otherwise


class ConfigError(PipelabError):
    """A config value is wrong. The message names the key, the value and what is allowed."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


class DataError(PipelabError):
    """A dataset cannot be read (missing files, wrong format)."""


class WireError(PipelabError):
    """A packet on the wire is malformed: the one error decoding may raise."""


class DeadlockError(PipelabError):
    """Every role waits on something that will never arrive."""


class ScheduleError(PipelabError):
    """A pipeline schedule (its per-device programs of actions) cannot run as written: the message
    names its first problem in one line (framework.pipeline.validate). A config that names the
    schedule (a CSV file) reports it as `ConfigError(<key>, error.message)`."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)


# ---- one line -----------------------------------------------------------------------------------

LINE_MAX = 300  # the most characters of one printed error line, `error: ` included (bad input is one line)
CHOICES_MOST = 16  # a config group's options named in one error line (more: "... and N more")


def listing(names, most: int = 8) -> str:
    """`names` for a one-line message: joined by ', ', a run of numbered names (dev0, dev1, ...,
    dev99) as `dev0..dev99`, and past `most` items the first ones and `... and N more`."""
    items: list[str] = []
    run: list[tuple[str, int, str]] = []  # (prefix, number, name) of the current numbered run

    def close() -> None:
        if len(run) >= 3:
            items.append(f"{run[0][2]}..{run[-1][2]}")
        else:
            items.extend(r[2] for r in run)
        run.clear()

    for name in map(str, names):
        m = re.fullmatch(r"(.*?)(0|[1-9]\d*)", name)
        if m and run and m.group(1) == run[-1][0] and int(m.group(2)) == run[-1][1] + 1:
            run.append((m.group(1), int(m.group(2)), name))
            continue
        close()
        if m:
            run.append((m.group(1), int(m.group(2)), name))
        else:
            items.append(name)
    close()
    if len(items) > most:
        return ", ".join(items[: most - 1]) + f", ... and {len(items) - most + 1} more"
    return ", ".join(items)


def one_line(text: str, limit: int = LINE_MAX - len("error: ")) -> str:
    """An error message cut to `limit` characters (at a word, with a note of what was cut), so
    that `error: <message>` fits LINE_MAX: the message's source should say less (`listing`);
    this keeps a miss from flooding a terminal (one message once ran to 989,064 bytes). A
    message of several lines (a role's traceback) is a report, not one line: kept whole."""
    text = str(text)
    if len(text) <= limit or "\n" in text:
        return text
    note = " ... [{} more characters]"
    keep = limit - len(note.format(len(text)))
    cut = text.rfind(" ", keep // 2, keep)
    cut = cut if cut > 0 else keep
    shown = text[:cut].rstrip(" ,;")
    return shown + note.format(len(text) - len(shown))
