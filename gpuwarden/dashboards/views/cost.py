"""Cost and chargeback: what the fleet costs, what its idle time costs, who pays (totals reconcile to
the fleet cost), a reclaim what-if and buy-vs-rent. Numbers come from
:mod:`gpuwarden.dashboards.idle_cost_view` (analytics underneath)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from gpuwarden.dashboards import fleet_view as fv
from gpuwarden.dashboards import idle_cost_view as icv
from gpuwarden.dashboards.data import CACHE_TTL_S, read_window, require_store


@st.cache_data(ttl=CACHE_TTL_S, show_spinner="Pricing GPU time…")
def ledger(path: str, span: pd.Timedelta):
    return icv.ledger_for(read_window(path, span, icv.COLUMNS))


path, (oldest, newest) = require_store()
st.title("Cost and chargeback")
window = st.radio("Window", list(fv.WINDOWS), index=2, format_func=fv.WINDOW_LABELS.get, horizontal=True,
                  help="Relative to the newest sample in the store.")
data = ledger(path, fv.WINDOWS[window])
head = icv.cost_headline(data)
currency = head.currency
st.caption(f"Store `{path}` · {data.start:%Y-%m-%d %H:%M} → {data.end:%Y-%m-%d %H:%M} UTC · "
           f"built-in price book ({currency}); nodes priced by the default inventory patterns")

c1, c2, c3, c4 = st.columns(4)
c1.metric("Fleet cost", f"{head.fleet_cost:,.0f} {currency}")
c2.metric("Idle cost", f"{head.idle_cost:,.0f} {currency}",
          help="Cost of unallocated, allocated-idle, hoarded, fake-busy and starved GPU-hours.")
c3.metric("Cost per used GPU-hour", "n/a" if head.cost_per_used_gpu_hour is None else f"{head.cost_per_used_gpu_hour:,.2f} {currency}",
          help="Fleet cost over useful SM-hours: what real work costs.")
c4.metric("Energy", f"{head.energy_kwh:,.0f} kWh")

left, right = st.columns(2)
with left:
    st.subheader("By pool")
    st.dataframe(icv.cost_by_pool(data), hide_index=True, width="stretch")
with right:
    st.subheader("Idle cost by reason")
    reasons = icv.idle_cost_by_reason(data)
    st.bar_chart(reasons.set_index("reason")["cost"], horizontal=True, x_label=currency, y_label="")

st.subheader("Chargeback")
proportional = st.toggle("Spread unallocated cost over teams", value=False,
                         help="Off: capacity nobody held is its own row. On: its cost is shared by allocated GPU-hours.")
table = icv.chargeback_table(data, proportional)
st.dataframe(table, hide_index=True, width="stretch")
st.caption(f"Charged {table['cost'].sum():,.2f} {currency} = fleet cost {head.fleet_cost:,.2f} {currency}.")
st.download_button("Download chargeback CSV", table.to_csv(index=False), file_name="chargeback.csv", mime="text/csv")

st.subheader("Reclaim what-if")
percent = st.slider("Share of idle GPU-hours reclaimed (unallocated, allocated idle, hoarded)", 0, 100, 50, step=5)
what_if = icv.reclaim(data, percent / 100)
r1, r2, r3 = st.columns(3)
r1.metric("Bill falls by", f"{what_if['cost_reduction']:,.0f} {currency}",
          help="Released on-demand and spot capacity; reserved and owned capacity is paid for anyway.")
r2.metric("Committed capacity freed", f"{what_if['committed_value_freed']:,.0f} {currency}")
r3.metric("Throughput rises by", "n/a" if what_if["throughput_gain"] is None else f"{what_if['throughput_gain']:.0%}",
          help="Reclaimed hours put to work at the measured productivity of busy and underutilised hours.")

st.subheader("Buy vs rent")
st.dataframe(icv.buy_vs_rent(data), hide_index=True, width="stretch")
st.caption("Months until owning the GPUs costs less than renting the GPU-hours actually allocated, on demand, "
           "at the measured allocation and power.")
