"""What the code interpreter's Python kernel shows beside IPython's own formats (an IPython
extension loaded at kernel start, see ipython_kernel_config.py).

- `e2b/chart`: for every matplotlib Figure displayed (inline backend, `plt.show()`, or a figure
  as a cell's value), the data of its chart, in the shape E2B's SDK reads into its `chart`
  field (e2b_code_interpreter.charts): line, scatter, bar, pie, box_and_whisker, a superchart
  of several axes, or unknown. Read from the Figure's axes, lines, collections, bar containers
  and wedges; box plots from the statistics their Axes.bxp call drew (recorded on the axes, as
  the drawn lines alone do not say which value is which).
- `e2b/data`: a pandas DataFrame's columns as JSON (the SDK's `data` field).
- A PIL image saved by the cell is shown too (as E2B's kernel does), once per save.

Written for this project from the SDK's models; nothing here fails a cell: an extraction that
raises gives no chart (the figure's PNG is still returned).
"""

import math
import os
import re

from IPython.core.formatters import JSONFormatter
from traitlets import Unicode


class _MimeFormatter(JSONFormatter):
    """A JSON-valued display format of our own (no object has its print method)."""

    print_method = Unicode("_repr_aegis_unused_")


def _format(ip, mime, type_module, type_name, function):
    formatters = ip.display_formatter.formatters
    if mime not in formatters:
        formatters[mime] = _MimeFormatter(parent=ip.display_formatter)
        formatters[mime].format_type = mime
        if mime not in ip.display_formatter.active_types:
            ip.display_formatter.active_types.append(mime)
    formatters[mime].for_type_by_name(type_module, type_name, _quiet(function))


def _quiet(function):
    def safe(obj):
        try:
            return function(obj)
        except Exception:
            return None

    return safe


# ---- numbers and axes ----------------------------------------------------------------------


def _num(value):
    """A finite float, or None (JSON has no NaN or infinity)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _text(value):
    """A label as the SDK wants it: None for empty and matplotlib's hidden `_...` labels."""
    if value is None:
        return None
    value = str(value)
    return None if not value or value.startswith("_") else value


_UNIT = re.compile(r"[\(\[]([^\(\)\[\]]+)[\)\]]\s*$")


def _unit(label):
    """The unit written at the end of an axis label: 'Time (s)' -> 's', 'Length [m]' -> 'm'."""
    if not label:
        return None
    found = _UNIT.search(label)
    return found.group(1).strip() if found else None


def _kind(axis):
    """'datetime', 'categorical' or matplotlib's scale name of an axis."""
    converter = getattr(axis, "converter", None)
    if converter is not None:
        module = type(converter).__module__
        if module == "matplotlib.dates":
            return "datetime"
        if module == "matplotlib.category":
            return "categorical"
    return axis.get_scale()


def _categories(axis):
    """An axis's category positions -> names, when its values are strings."""
    units = getattr(axis, "units", None)
    mapping = getattr(units, "_mapping", None)
    if not mapping:
        return {}
    return {int(v): str(k) for k, v in mapping.items()}


def _value_on(axis, kind, value):
    """A position on an axis as the chart reports it: ISO date, category name or float."""
    f = _num(value)
    if f is None:
        return None
    if kind == "datetime":
        from matplotlib import dates

        try:
            return dates.num2date(f).isoformat()
        except (ValueError, OverflowError):
            return None
    if kind == "categorical":
        name = _categories(axis).get(int(round(f)))
        if name is not None:
            return name
    return f


def _axis_fields(ax, prefix, axis):
    kind = _kind(axis)
    label = axis.get_label().get_text() or None
    ticks = [_value_on(axis, kind, t) for t in axis.get_ticklocs()]
    return {
        f"{prefix}_label": label,
        f"{prefix}_unit": _unit(label),
        f"{prefix}_scale": kind,
        f"{prefix}_ticks": [t for t in ticks if t is not None],
        f"{prefix}_tick_labels": [t.get_text() for t in axis.get_ticklabels()],
    }


def _title(ax):
    return ax.get_title() or ax.get_title("left") or ax.get_title("right") or None


# ---- one axes -> one chart -------------------------------------------------------------------


def _boxes(ax):
    stats = getattr(ax, "_aegis_box_stats", None)
    if not stats:
        return None
    elements = []
    for i, s in enumerate(stats):
        label = s.get("label")
        elements.append(
            {
                "label": str(label) if label is not None else str(i + 1),
                "min": _num(s["whislo"]),
                "first_quartile": _num(s["q1"]),
                "median": _num(s["med"]),
                "third_quartile": _num(s["q3"]),
                "max": _num(s["whishi"]),
                "outliers": [_num(v) for v in s.get("fliers", [])],
            }
        )
    return elements


def _pie(ax):
    from matplotlib.patches import Wedge

    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if not wedges:
        return None
    return [
        {
            "label": _text(w.get_label()),
            # pie() computes in float32: 4 decimals of a degree are what is exact.
            "angle": round(abs(w.theta2 - w.theta1), 4),
            "radius": _num(w.r),
        }
        for w in wedges
    ]


def _bars(ax):
    from matplotlib.container import BarContainer

    containers = [c for c in ax.containers if isinstance(c, BarContainer)]
    if not containers:
        return None
    elements = []
    for container in containers:
        horizontal = getattr(container, "orientation", "vertical") == "horizontal"
        axis = ax.yaxis if horizontal else ax.xaxis
        kind = _kind(axis)
        shown = {}
        for loc, text in zip(axis.get_ticklocs(), axis.get_ticklabels()):
            shown[round(float(loc), 9)] = text.get_text()
        for rect in container.patches:
            if horizontal:
                at, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
            else:
                at, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
            label = _value_on(axis, kind, at)
            if kind != "categorical" and round(float(at), 9) in shown:
                label = shown[round(float(at), 9)] or label
            elements.append(
                {
                    "label": str(label) if label is not None else None,
                    "group": _text(container.get_label()),
                    "value": _num(value),
                }
            )
    return elements


def _points(ax, kx, ky, x, y):
    out = []
    for a, b in zip(x, y):
        pa, pb = _value_on(ax.xaxis, kx, a), _value_on(ax.yaxis, ky, b)
        if pa is not None and pb is not None:
            out.append([pa, pb])
    return out


def _lines(ax, kx, ky):
    elements = []
    for line in ax.get_lines():
        x, y = line.get_xdata(orig=False), line.get_ydata(orig=False)
        elements.append({"label": _text(line.get_label()), "points": _points(ax, kx, ky, x, y)})
    return elements


def _scatters(ax, kx, ky):
    from matplotlib.collections import PathCollection

    elements = []
    for collection in ax.collections:
        if not isinstance(collection, PathCollection):
            continue
        offsets = collection.get_offsets()
        xs = [o[0] for o in offsets]
        ys = [o[1] for o in offsets]
        elements.append({"label": _text(collection.get_label()), "points": _points(ax, kx, ky, xs, ys)})
    return elements


def axes_chart(ax):
    """The chart of one Axes."""
    labels = {
        "x_label": ax.xaxis.get_label().get_text() or None,
        "y_label": ax.yaxis.get_label().get_text() or None,
    }
    labels["x_unit"] = _unit(labels["x_label"])
    labels["y_unit"] = _unit(labels["y_label"])
    base = {"title": _title(ax), **labels}

    boxes = _boxes(ax)
    if boxes is not None:
        return {"type": "box_and_whisker", **base, "elements": boxes}
    wedges = _pie(ax)
    if wedges is not None:
        return {"type": "pie", "title": base["title"], "elements": wedges}
    bars = _bars(ax)
    if bars is not None:
        return {"type": "bar", **base, "elements": bars}

    kx, ky = _kind(ax.xaxis), _kind(ax.yaxis)
    lines = _lines(ax, kx, ky)
    scatters = [] if lines else _scatters(ax, kx, ky)
    if lines or scatters:
        return {
            "type": "line" if lines else "scatter",
            "title": base["title"],
            **_axis_fields(ax, "x", ax.xaxis),
            **_axis_fields(ax, "y", ax.yaxis),
            "elements": lines or scatters,
        }
    return {"type": "unknown", **base, "elements": []}


def figure_chart(fig):
    """The chart of a Figure: its one axes' chart, or a superchart of each axes' (colorbars left
    out); None for a figure without axes."""
    axes = [ax for ax in fig.get_axes() if ax.get_label() != "<colorbar>"]
    if not axes:
        return None
    suptitle = getattr(fig, "_suptitle", None)
    suptitle = suptitle.get_text() if suptitle is not None else None
    if len(axes) == 1:
        chart = axes_chart(axes[0])
        if not chart.get("title") and suptitle:
            chart["title"] = suptitle
        return chart
    return {"type": "superchart", "title": suptitle or None, "elements": [axes_chart(ax) for ax in axes]}


# ---- recording box plots -----------------------------------------------------------------------


def _record_box_plots():
    """Axes.bxp (what boxplot draws with) keeps the statistics it drew on its axes."""
    from matplotlib.axes import Axes

    drawn = Axes.bxp
    if getattr(drawn, "_aegis_records", False):
        return

    def bxp(self, bxpstats, *args, **kwargs):
        result = drawn(self, bxpstats, *args, **kwargs)
        try:
            recorded = getattr(self, "_aegis_box_stats", [])
            recorded.extend(dict(s) for s in bxpstats)
            self._aegis_box_stats = recorded
        except Exception:
            pass
        return result

    bxp._aegis_records = True
    bxp.__doc__ = drawn.__doc__
    bxp.__wrapped__ = drawn
    Axes.bxp = bxp


# ---- data frames and saved images -------------------------------------------------------------


def dataframe_data(df):
    import json

    return json.loads(df.to_json(orient="columns", date_format="iso", default_handler=str))


def _show_saved_images():
    try:
        from PIL import Image
    except ImportError:
        return
    save = Image.Image.save
    if getattr(save, "_aegis_shows", False):
        return

    def saved(self, fp, *args, **kwargs):
        result = save(self, fp, *args, **kwargs)
        # Only a save to a file by name: the PNG IPython makes to show it saves to a buffer.
        if not isinstance(fp, (str, os.PathLike)):
            return result
        try:
            from IPython.display import display

            display(self)
        except Exception:
            pass
        return result

    saved._aegis_shows = True
    saved.__doc__ = save.__doc__
    saved.__wrapped__ = save
    Image.Image.save = saved


def load_ipython_extension(ip):
    _format(ip, "e2b/chart", "matplotlib.figure", "Figure", figure_chart)
    _format(ip, "e2b/data", "pandas.core.frame", "DataFrame", dataframe_data)
    try:
        _record_box_plots()
    except ImportError:
        pass
    _show_saved_images()
