"""``gpfl tasks``: the tasks installed in this environment, and which this device allows.

A run names its task; each side resolves the name against the plugins installed in its own
environment (`tasks.installed_tasks`) and a device also against its ``allowed-tasks``. This lists
them as a device owner needs them: the name, the package that registers it and its class, whether
it is a classifier (its metric), the format its delivered models are written in, the settings of
the run config it reads, whether this device's policy allows it, and the optional part of gpfl it
needs where that is not installed here.
"""

from __future__ import annotations

from typing import Any

from client.policy import DevicePolicy
from settings.extras import extras_for_device, missing_modules

__all__ = ["format_task_rows", "task_rows"]


def task_rows(policy: DevicePolicy | None = None) -> list[dict[str, Any]]:
    """Return one row per installed task, in name order.

    ``policy`` (the device's) decides ``allowed``: without one, a device without settings (every
    installed task allowed). A task whose class cannot be imported is listed with the error.
    """
    from tasks import installed_tasks, owner_of, task_class

    allowed = policy.allowed_tasks if policy is not None else None
    rows = []
    for name, entry in sorted(installed_tasks().items()):
        row: dict[str, Any] = {"name": name, "package": owner_of(entry), "class": entry.value,
                               "allowed": allowed is None or name in allowed}
        missing = [extra for extra, _, _ in extras_for_device({"task": name})
                   if missing_modules(extra)]
        if missing:
            row["needs"] = [f"gpfl[{extra}]" for extra in missing]
        try:
            cls = task_class(name)
        except Exception as err:  # a plugin's import error is the plugin's: report, go on
            row["error"] = f"{type(err).__name__}: {err}"
        else:
            row.update(metric="accuracy" if cls.is_classifier else "loss",
                       model_format=cls.model_format, settings=list(cls.run_config_keys),
                       own_settings=[_declaration(d) for d in cls.settings])
        rows.append(row)
    return rows


def _declaration(setting: Any) -> dict[str, Any]:
    """Return a plugin setting's declaration as plain data: name, type, default, bounds, help."""
    bounds = {key: getattr(setting, key) for key in ("minimum", "maximum", "choices")
              if getattr(setting, key, None) not in (None, ())}
    return {"name": setting.name, "type": setting.type.__name__, "default": setting.default,
            **bounds, "help": setting.help}


def format_task_rows(rows: list[dict[str, Any]]) -> str:
    """Return the rows as text: one line per task, its settings on the next."""
    lines = []
    for row in rows:
        head = (f"{row['name']}: {row['class']} (package {row['package']}); "
                f"{'allowed' if row['allowed'] else 'NOT allowed'} on this device")
        if "needs" in row:
            head += f"; needs {', '.join(row['needs'])}, not installed here"
        if "error" in row:
            lines += [head, f"    cannot be imported: {row['error']}"]
            continue
        lines += [head + f"; metric {row['metric']}; models as {row['model_format']}",
                  "    settings: " + (", ".join(row["settings"]) or "none")]
        lines += [f"    own setting (in task-settings) {d['name']} = {d['default']!r} "
                  f"({d['type']}): {d['help']}" for d in row["own_settings"]]
    return "\n".join(lines)
