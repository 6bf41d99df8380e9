"""prickle.py reads as a book: its map is true and its chapters keep to their order.

The module is cut into chapters by banners (a line of 79 ``#``, ``# N. Title`` or ``# Appendix X.
Title``, another line of 79 ``#``). This test holds it to what the module docstring promises:
the contents list names every chapter in order; a chapter uses only names defined in earlier
chapters (BORROWED_FORWARD lists the exceptions, and may only shrink); a name with a leading
underscore stays in its chapter; a lifecycle's state column is written only by move(); no
chapter is over 900 lines and no function over 80; the runner's appendices use only chapter 1
and each other. It reads the source with ``ast`` and imports nothing of it but its tables.
"""

import ast
import re
from pathlib import Path

import prickle

SOURCE = Path(prickle.__file__).read_text(encoding="utf-8")
LINES = SOURCE.split("\n")
TREE = ast.parse(SOURCE)

#: Names a chapter may use though a later chapter defines them. Empty: keep it so.
BORROWED_FORWARD: set[str] = set()
CHAPTER_MAX_LINES = 900
FUNCTION_MAX_LINES = 80
BANNER = "#" * 79


def chapters() -> list[tuple[str, str, int, int]]:
    """``(label, title, first line, last line)`` of each chapter, in order (1-based lines)."""
    found = []
    for i in range(len(LINES) - 2):
        if LINES[i] == BANNER and LINES[i + 2] == BANNER:
            m = re.fullmatch(r"# (\d+|Appendix [A-Z])\. (.+)", LINES[i + 1])
            assert m, f"line {i + 2}: a banner must read '# N. Title' or '# Appendix X. Title'"
            found.append((m.group(1), m.group(2), i + 1))
    return [(label, title, start, found[k + 1][2] - 1 if k + 1 < len(found) else len(LINES))
            for k, (label, title, start) in enumerate(found)]


CHAPTERS = chapters()


def chapter_of(line: int) -> int:
    """The index in CHAPTERS of the chapter holding ``line`` (-1 before the first: the imports)."""
    index = -1
    for k, (_, _, start, _) in enumerate(CHAPTERS):
        if start <= line:
            index = k
    return index


def defined_names(node: ast.stmt) -> list[str]:
    """The module-level names one top-level statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return [n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)]


class Uses(ast.NodeVisitor):
    """The module-level names a statement reads, leaving out names its functions bind themselves."""

    def __init__(self, module_names: set[str]):
        self.module_names, self.uses, self.scopes = module_names, set(), []

    @staticmethod
    def _bound(fn: ast.AST) -> set[str]:
        args = fn.args
        names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        names |= {a.arg for a in (args.vararg, args.kwarg) if a}
        declared_global = {n for node in ast.walk(fn) if isinstance(node, ast.Global) for n in node.names}

        def walk(node: ast.AST) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(child.name)
                    continue
                if isinstance(child, ast.Lambda):
                    continue
                if isinstance(child, ast.Name) and isinstance(child.ctx, (ast.Store, ast.Del)):
                    names.add(child.id)
                elif isinstance(child, ast.alias):
                    names.add((child.asname or child.name).split(".")[0])
                elif isinstance(child, ast.ExceptHandler) and child.name:
                    names.add(child.name)
                walk(child)
        for statement in fn.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(statement.name)
            else:
                walk(statement)
        return names - declared_global

    def visit_FunctionDef(self, node: ast.AST) -> None:
        for expr in [*node.decorator_list, *node.args.defaults, *filter(None, node.args.kw_defaults),
                     *filter(None, [node.returns]),
                     *(a.annotation for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                       if a.annotation)]:
            self.visit(expr)
        self.scopes.append(self._bound(node))
        for statement in node.body:
            self.visit(statement)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.scopes.append({a.arg for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs})
        self.visit(node.body)
        self.scopes.pop()

    def _comprehension(self, node: ast.AST) -> None:
        self.scopes.append({n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)})
        self.generic_visit(node)
        self.scopes.pop()

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id in self.module_names \
                and not any(node.id in scope for scope in self.scopes):
            self.uses.add(node.id)


def statements() -> list[dict]:
    """Every top-level statement: its node, chapter, the names it binds and those it reads."""
    out = []
    for node in TREE.body:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        out.append({"node": node, "chapter": chapter_of(start), "binds": defined_names(node)})
    home = {}
    for s in out:
        for name in s["binds"]:
            home.setdefault(name, s["chapter"])
    for s in out:
        uses = Uses(set(home))
        uses.visit(s["node"])
        s["uses"] = uses.uses
    return out, home


STATEMENTS, HOME = statements()


def chapter_name(index: int) -> str:
    label, title, _, _ = CHAPTERS[index]
    return f"{label}. {title}"


def test_the_contents_list_names_every_chapter_in_order_as_its_banner_does():
    doc = ast.get_docstring(TREE)
    # An entry may wrap: its continuation lines are indented further than its first.
    entries = re.findall(r"^  (\d+|Appendix [A-Z])\. (.+?) -- ", re.sub(r"\n {6}", " ", doc), re.M)
    assert entries == [(label, title.removeprefix(f"Appendix {label[-1]}. ") if label.startswith("Appendix")
                        else title) for label, title, _, _ in CHAPTERS]
    numbers = [int(label) for label, _, _, _ in CHAPTERS if label.isdigit()]
    assert numbers == list(range(1, len(numbers) + 1)), "chapters are numbered 1, 2, 3, ... in order"
    before = [s["binds"] for s in STATEMENTS if s["chapter"] == -1
              and not isinstance(s["node"], (ast.Import, ast.ImportFrom, ast.Expr))]
    assert before == [["__version__"], ["__all__"]], "before chapter 1: the docstring, imports, __version__, __all__"


def test_a_chapter_uses_only_names_of_earlier_chapters():
    forward = sorted({(chapter_name(s["chapter"]), name, chapter_name(HOME[name]))
                      for s in STATEMENTS for name in s["uses"]
                      if HOME[name] > s["chapter"] and name not in BORROWED_FORWARD})
    assert forward == [], "a chapter uses a later chapter's name: move it, or the use, to where it belongs"
    assert len(BORROWED_FORWARD) <= 6


def test_a_private_name_stays_in_its_chapter():
    crossing = sorted({(name, chapter_name(HOME[name]), chapter_name(s["chapter"]))
                       for s in STATEMENTS for name in s["uses"]
                       if name.startswith("_") and not name.startswith("__")
                       and HOME[name] >= 0 and HOME[name] != s["chapter"]})
    assert crossing == [], "a _name is used outside its chapter: drop the underscore or move the use"


def test_the_runner_appendices_use_only_chapter_1_and_each_other():
    helpers = 0
    appendices = {k for k, (label, _, _, _) in enumerate(CHAPTERS) if label.startswith("Appendix")}
    assert appendices, "the runner is an appendix"
    used = sorted({(chapter_name(s["chapter"]), name) for s in STATEMENTS if s["chapter"] in appendices
                   for name in s["uses"] if HOME[name] not in appendices | {helpers, -1}})
    assert used == []


def test_no_chapter_is_longer_than_900_lines_and_no_function_than_80():
    long_chapters = [(f"{label}. {title}", end - start + 1) for label, title, start, end in CHAPTERS
                     if end - start + 1 > CHAPTER_MAX_LINES]
    assert long_chapters == []
    long_functions = sorted(
        (node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(TREE)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > FUNCTION_MAX_LINES)
    assert long_functions == []


def _sql_texts(node: ast.AST):
    """The string constants (and literal parts of f-strings) under ``node``, with their line."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            yield sub.lineno, sub.value
        elif isinstance(sub, ast.JoinedStr):
            yield sub.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in sub.values)


def test_a_lifecycle_state_is_written_only_by_its_move():
    columns = {(life.table, life.column) for life in prickle.LIFECYCLES.values()}
    state_columns = {column for _, column in columns}
    raw = []
    for s in STATEMENTS:
        if s["binds"] and s["binds"][0] in ("MIGRATIONS", "move"):
            continue  # the schema's own upgrades, and the one guarded move
        for line, text in _sql_texts(s["node"]):
            for table, sets in re.findall(r"UPDATE\s+(\w+)\s+SET\s+(.+?)(?:\s+WHERE\b|$)", text, re.S):
                for column in re.findall(r"(\w+)\s*=", sets):
                    if (table, column) in columns:
                        raw.append((line, table, column))
        for call in ast.walk(s["node"]):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) in ("move", "move_task"):
                raw += [(call.lineno, "changes", k.arg) for k in call.keywords if k.arg in state_columns]
    assert raw == [], "a lifecycle's state column is written outside move(): make it a move of its table"
    assert {"lead", "start"} <= set(prickle.LIFECYCLES)


#: Each chapter of Part II (the team's work) and the test file that holds its tests.
PART_II_TESTS = {
    "People and teams": "test_people.py",
    "Projects, their members, agents and keys": "test_people.py",
    "Invites": "test_invites.py",
    "Confirming it's you": "test_step_up.py",
    "Share rules": "test_share_rules.py",
    "Memory and pulse": "test_memory_pulse.py",
    "The default lead": "test_lead.py",
    "Private rooms: turns": "test_turns.py",
    "Files: the store and attachments": "test_files.py",
    "Messages: writing, mentions and the loop guard": "test_messages.py",
    "The room: reading it": "test_room.py",
    "Attempts: the record of a run": "test_runs.py",
    "Tasks: handoff and the gate": "test_tasks.py",
    "Results and evidence": "test_results.py",
    "Approvals and the people's side of tasks": "test_approvals.py",
    "The owner's gate rules": "test_rules.py",
    "Runs: devices, claims and steps": "test_runs.py",
    "Run control": "test_run_control.py",
    "The board and the task page": "test_board.py",
    "Connecting a computer or an app": "test_connect.py",
    "Make-or-spend actions": "test_actions.py",
    "Private rooms: discussions": "test_discussions.py",
    "Leaving and removal": "test_leaving.py",
    "Search": "test_search.py",
    "The inbox and the digest": "test_inbox.py",
    "Web Push: told when away": "test_push.py",
    "Private rooms: schedules": "test_schedules.py",
    "The project story": "test_story.py",
    "Deleting, restoring and erasing a project": "test_deletion.py",
    "Closing an account": "test_close_account.py",
    "Exporting a project": "test_export.py",
}


def test_each_chapter_of_part_ii_has_its_test_file_and_no_test_file_imports_another():
    doc = re.sub(r"\n {6}", " ", ast.get_docstring(TREE))
    part_ii = doc[doc.index("\nPart II."):doc.index("\nPart III.")]
    titles = re.findall(r"^  \d+\. (.+?) -- ", part_ii, re.M)
    assert titles == list(PART_II_TESTS), "PART_II_TESTS names Part II's chapters, in order"
    here = Path(__file__).parent
    for title, name in PART_II_TESTS.items():
        assert re.search(r"^def test_", (here / name).read_text(encoding="utf-8"), re.M), (title, name)
    imports = sorted((path.name, line) for path in here.glob("test_*.py")
                     for line in path.read_text(encoding="utf-8").splitlines()
                     if re.match(r"\s*(from|import) test_\w+", line))
    assert imports == [], "shared test steps live in helpers.py (the team's) or browser.py (the page's)"
