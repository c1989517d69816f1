"""The interactive ``kcops top`` screen (textual).

Data is read in a worker thread every ``refresh_s`` so the screen never waits
on the network. Keys: ``r`` opens the selected alert's runbook, ``x`` picks an
action and runs it through the agent's guards after a confirmation, with the
token from ``--token-file`` or ``KCOPS_TOKEN``; ``g`` refreshes now, ``q`` quits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Label, Markdown, OptionList, Static

from kcops.cli import topview
from kcops.cli.topdata import HISTORY_KEYS, HISTORY_POINTS, AgentClient, Snapshot, snapshot
from kcops.errors import KcopsError


class RunbookScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,r", "dismiss", "close")]

    def __init__(self, name: str, text: str) -> None:
        super().__init__()
        self.runbook_name = name
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="runbook"):
            yield Markdown(self.text)
        yield Footer()


class ActionPicker(ModalScreen[str | None]):
    """Choose an action; dismisses with its name, or None on escape."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel")]

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.names = names

    def compose(self) -> ComposeResult:
        with Vertical(id="picker"):
            yield Label("Run which action? (enter to choose, escape to cancel)")
            yield OptionList(*self.names, id="actions")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.names[event.option_index])

    def action_cancel(self) -> None:
        self.dismiss(None)


class Confirm(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "yes", "yes"),
        Binding("n,escape", "no", "no"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Label(self.question)
            yield Label("[b]y[/b] run it   [b]n[/b] cancel")

    def action_yes(self) -> None:
        self.dismiss(True)

    def action_no(self) -> None:
        self.dismiss(False)


class TopApp(App[None]):
    # 80×24: head 1, serving | cache and memory 5, attention 3, alerts 1 + up to 6,
    # last actions 1 + the rest, footer 1. Nothing scrolls off.
    CSS = """
    Static { padding: 0; }
    .title { color: $accent; text-style: bold; height: 1; }
    #top { height: auto; }
    #left { width: 41; height: auto; }
    #right { width: 37; height: auto; margin-left: 2; }
    #alerts { height: auto; max-height: 6; }
    #actions { height: 1fr; }
    #picker, #confirm { width: 60; height: auto; border: thick $accent; background: $surface;
                        padding: 1; }
    #picker OptionList { height: auto; max-height: 12; }
    ActionPicker, Confirm, RunbookScreen { align: center middle; }
    #runbook { width: 100%; height: 1fr; background: $surface; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("r", "runbook", "runbook"),
        Binding("x", "pick_action", "run action"),
        Binding("g", "refresh", "refresh"),
    ]

    def __init__(
        self, client: AgentClient, headers: Callable[[], dict[str, str]], refresh_s: float = 2.0
    ) -> None:
        super().__init__()
        self.client = client
        self.headers = headers
        self.refresh_s = refresh_s
        self.snap: Snapshot | None = None
        self.history: dict[str, list[float | None]] = {}
        self.last_result: dict[str, object] | None = None
        self.frames = 0

    def compose(self) -> ComposeResult:
        serving, memory, attention, alerts, actions = topview.SECTIONS
        yield Static("connecting…", id="head")
        with Horizontal(id="top"):
            with Vertical(id="left"):
                yield Label(f"── {serving}", classes="title")
                yield Static("", id="serving")
            with Vertical(id="right"):
                yield Label(f"── {memory}", classes="title")
                yield Static("", id="memory")
        yield Label(f"── {attention}", classes="title")
        yield Static("", id="kc")
        yield Label(f"── {alerts}", id="alerts-title", classes="title")
        yield DataTable(id="alerts", cursor_type="row", show_header=False)
        yield Label(f"── {actions} (x: run one)", classes="title")
        yield Static("", id="actions")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#alerts", DataTable)
        table.add_columns("alert", "state", "for", "value")
        self.action_refresh()
        self.set_interval(self.refresh_s, self.action_refresh)

    def action_refresh(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="refresh")
    def _load(self) -> None:
        try:
            snap = snapshot(self.client, with_history=not self.history)
        except KcopsError as exc:
            self.call_from_thread(self.notify, str(exc), severity="error")
            return
        self.call_from_thread(self.show, snap)

    def show(self, snap: Snapshot) -> None:
        if not self.history:
            self.history = {k: list(v) for k, v in snap.history.items()}
        else:
            for k in HISTORY_KEYS:
                series = self.history.setdefault(k, [])
                series.append(snap.values.get(k))
                del series[:-HISTORY_POINTS]
        snap.history = self.history
        self.snap = snap
        self.query_one("#head", Static).update(topview.header(snap))
        self.query_one("#serving", Static).update(topview.serving(snap))
        self.query_one("#memory", Static).update(topview.memory(snap))
        self.query_one("#kc", Static).update(topview.kc(snap))
        self.query_one("#alerts-title", Label).update(
            "── " + topview.alerts_title(snap, " (r: runbook)")
        )
        self.query_one("#actions", Static).update(topview.actions(snap))
        self._fill_alerts(snap)
        self.frames += 1

    def _fill_alerts(self, snap: Snapshot) -> None:
        table = self.query_one("#alerts", DataTable)
        row = table.cursor_row
        table.clear()
        for name, state, span, val in topview.alert_rows(snap):
            table.add_row(name, state, span, val, key=f"{name}/{table.row_count}")
        if table.row_count:
            table.move_cursor(row=min(row, table.row_count - 1))

    def selected_alert(self) -> str | None:
        table = self.query_one("#alerts", DataTable)
        if not table.row_count:
            return None
        return str(table.get_row_at(table.cursor_row)[0])

    def action_runbook(self) -> None:
        from kcops.cli.runbook import runbook_names, runbook_text

        name = self.selected_alert()
        if name is None or name not in runbook_names():
            self.notify(f"no runbook for {name or 'no alert selected'}", severity="warning")
            return
        self.push_screen(RunbookScreen(name, runbook_text(name)))

    def action_pick_action(self) -> None:
        self._list_actions()

    @work(thread=True, exclusive=True, group="actions")
    def _list_actions(self) -> None:
        try:
            listing = self.client.get("/api/v1/actions") or {}
        except KcopsError as exc:
            self.call_from_thread(self.notify, str(exc), severity="error")
            return
        names = [a["name"] for a in listing.get("actions", [])]
        if not names:
            self.call_from_thread(self.notify, "the agent offers no actions", severity="warning")
            return
        self.call_from_thread(self.push_screen, ActionPicker(names), self._chosen)

    def _chosen(self, name: str | None) -> None:
        if name is None:
            return
        question = f"Run [b]{name}[/b] on {self.client.url}? It goes through the agent's guards."
        self.push_screen(Confirm(question), lambda yes: self._confirmed(name, bool(yes)))

    def _confirmed(self, name: str, yes: bool) -> None:
        if yes:
            self._run_chosen(name)

    @work(thread=True, group="actions")
    def _run_chosen(self, name: str) -> None:
        try:
            # The audit record carries its own time: the reason says who, not when.
            rec = self.client.run_action(name, self.headers(), reason="kcops top (on-call)")
        except KcopsError as exc:
            rec = {"error": str(exc)}
        self.last_result = rec
        outcome = rec.get("outcome") or rec.get("error") or rec.get("detail") or "?"
        sev = "information" if rec.get("outcome") in ("ok", "dry_run") else "error"
        self.call_from_thread(self.notify, f"{name}: {outcome}", severity=sev)
        self.call_from_thread(self.action_refresh)
