"""Drawing helpers every page shares: readable tables (units in headers, cost first, diagnostic
columns behind an expander) and stacked charts in the one state palette."""

from __future__ import annotations

from collections.abc import Iterable

import altair as alt
import pandas as pd
import streamlit as st

from . import fmt
from .palette import STATE_COLOURS, STATE_LABELS, by_size

MONEY_HINTS = ("cost", "price", "capex", "savings", "spend", "value", "reduction", "budget")
DIAGNOSTIC_HINTS = ("sm_measured", "activity_source", "samples", "step", "uuid", "source", "mig_instance")


def _is_money(column: str) -> bool:
    return any(hint in column for hint in MONEY_HINTS) and not column.endswith(("_share", "_ratio", "_months"))


def _is_ratio(column: str) -> bool:
    return column.endswith(("_ratio", "_share")) or column in ("share", "utilisation", "efficiency_score", "idle_share")


def column_config(frame: pd.DataFrame, currency: str = "USD") -> dict:
    config: dict = {}
    for column in frame.columns:
        header = fmt.title(str(column))
        if str(column) in STATE_LABELS:  # the idle report's wide tables: GPU-hours per state
            config[column] = st.column_config.NumberColumn(f"{STATE_LABELS[str(column)]} (GPU-h)", format="%.1f")
        elif _is_money(str(column)):
            config[column] = st.column_config.NumberColumn(f"{header} ({currency})", format="%.2f")
        elif _is_ratio(str(column)):
            config[column] = st.column_config.ProgressColumn(header, min_value=0.0, max_value=1.0, format="percent")
        elif str(column).endswith("gpu_hours") or str(column) == "gpu_hours" or str(column).endswith("_kwh"):
            config[column] = st.column_config.NumberColumn(header, format="%.1f")
        elif pd.api.types.is_float_dtype(frame[column]):
            config[column] = st.column_config.NumberColumn(header, format="%.2f")
        else:
            config[column] = st.column_config.Column(header)
    return config


def table(frame: pd.DataFrame, currency: str = "USD", diagnostic: Iterable[str] = (), key_columns: Iterable[str] = (),
          height: int | None = None) -> None:
    """A table: key columns, then money, then the rest; diagnostic columns in an expander below."""
    if frame is None or frame.empty:
        st.caption("Nothing in this window.")
        return
    diagnostic = [c for c in frame.columns if c in set(diagnostic) or any(h in str(c) for h in DIAGNOSTIC_HINTS)]
    keys = [c for c in key_columns if c in frame.columns]
    money = [c for c in frame.columns if _is_money(str(c)) and c not in keys and c not in diagnostic]
    rest = [c for c in frame.columns if c not in keys and c not in money and c not in diagnostic]
    main = frame[keys + money + rest]
    kwargs = {"height": height} if height else {}
    st.dataframe(main, hide_index=True, width="stretch", column_config=column_config(main, currency), **kwargs)
    if diagnostic:
        with st.expander("Diagnostic columns"):
            extra = frame[keys + diagnostic]
            st.dataframe(extra, hide_index=True, width="stretch", column_config=column_config(extra, currency))


def stacked_states(table: pd.DataFrame, y_title: str, key: str | None = None) -> None:
    """Stacked area over time, one fixed colour per state, the largest state at the bottom."""
    if table is None or table.empty:
        st.caption("Not enough whole time buckets in this window to draw.")
        return
    totals = {str(c): float(table[c].sum()) for c in table.columns}
    order = [s for s in by_size(totals) if totals[s] > 0]
    long = table[order].rename_axis("time").reset_index().melt("time", var_name="state", value_name="value")
    long["time"] = pd.DatetimeIndex(long["time"]).tz_convert(None)
    long["rank"] = long["state"].map({s: i for i, s in enumerate(order)})
    long["label"] = long["state"].map(lambda s: STATE_LABELS.get(s, s))
    labels = [STATE_LABELS.get(s, s) for s in order]
    colours = [STATE_COLOURS.get(s, "#bdbdbd") for s in order]
    chart = alt.Chart(long).mark_area().encode(
        x=alt.X("time:T", title="UTC (sample time)"),
        y=alt.Y("value:Q", stack="zero", title=y_title),
        color=alt.Color("label:N", scale=alt.Scale(domain=labels, range=colours), sort=labels, title="State"),
        order=alt.Order("rank:Q", sort="ascending"),
        tooltip=[alt.Tooltip("time:T"), alt.Tooltip("label:N", title="State"), alt.Tooltip("value:Q", format=",.2f")],
    )
    st.altair_chart(chart, width="stretch", key=key)


def state_bars(frame: pd.DataFrame, value: str, title: str) -> None:
    """Horizontal bars per state (column ``state``), largest first, in the state palette."""
    if frame is None or frame.empty:
        st.caption("Nothing in this window.")
        return
    frame = frame.assign(label=frame["state"].map(lambda s: STATE_LABELS.get(s, s)))
    order = list(frame.sort_values(value, ascending=False)["label"])
    colours = [STATE_COLOURS.get(s, "#bdbdbd") for s in frame.sort_values(value, ascending=False)["state"]]
    chart = alt.Chart(frame).mark_bar().encode(
        x=alt.X(f"{value}:Q", title=title),
        y=alt.Y("label:N", sort=order, title=None),
        color=alt.Color("label:N", scale=alt.Scale(domain=order, range=colours), legend=None),
        tooltip=[alt.Tooltip("label:N", title="State"), alt.Tooltip(f"{value}:Q", format=",.2f")],
    )
    st.altair_chart(chart, width="stretch")


def lines(table: pd.DataFrame, y_title: str, x_title: str, key: str | None = None) -> None:
    """A line per column over time (index: naive UTC), as a plain Vega-Lite spec: no Altair
    validation on each rerun, which is most of the cost of many small charts on one page."""
    if table is None or table.empty:
        st.caption("Nothing measured in this window.")
        return
    long = table.rename_axis("time").reset_index().melt("time", var_name="series", value_name="value").dropna()
    spec = {
        "mark": {"type": "line", "interpolate": "monotone"},
        "encoding": {
            "x": {"field": "time", "type": "temporal", "title": x_title},
            "y": {"field": "value", "type": "quantitative", "title": y_title},
            "color": {"field": "series", "type": "nominal", "title": None, "legend": {"orient": "bottom"}},
            "tooltip": [{"field": "time", "type": "temporal"}, {"field": "series", "type": "nominal"},
                        {"field": "value", "type": "quantitative", "format": ",.1f"}],
        },
    }
    st.vega_lite_chart(long, spec, width="stretch", key=key)
