"""Cost and chargeback: what the window's GPU time cost, by pool and by idle reason, over time, who
is charged for it, what reclaiming idle time would save, and buy vs rent. One ledger per window, shared
with the Idle and Queue pages (the ledger bundle of :mod:`gpuwarden.analytics.idle_cost_report`)."""

from __future__ import annotations

import streamlit as st

from gpuwarden.dashboards import data, fmt, show

info = data.require_store()
st.title("Cost and chargeback")
window = data.current_window(info)
ledger = data.bundle("ledger", info, window)
head = ledger["cost_headline"]
currency = head["currency"]
data.window_caption(info, window, f" · price book {data.price_book_name(ledger)} ({currency})", bundles=(ledger,))
tiers = ledger.values.get("price_tiers")
if tiers:
    st.caption(tiers[0].upper() + tiers[1:])

c1, c2, c3, c4 = st.columns(4)
c1.metric("Fleet cost", fmt.money(head["fleet_cost"], currency, 0))
c2.metric("Idle cost", fmt.money(head["idle_cost"], currency, 0),
          help="Cost of unallocated, allocated-idle, hoarded, fake-busy and starved GPU-hours.")
c3.metric("Cost per used GPU-hour", fmt.money(head["cost_per_used_gpu_hour"], currency, 2),
          help="Fleet cost over useful SM-hours: what real work costs.")
c4.metric("Energy", f"{head['energy_kwh']:,.0f} kWh")

st.subheader(f"Cost over time ({currency} per bucket, by state)")
show.stacked_states(ledger["cost_timeline"], f"{currency} per bucket", key="cost_over_time")

left, right = st.columns(2)
with left:
    st.subheader("By pool")
    show.table(ledger["cost_by_pool"], currency,
               key_columns=["pool", "tier", "model"])
with right:
    st.subheader(f"Idle cost by reason ({currency})")
    show.state_bars(ledger["idle_cost_by_reason"], "cost", currency)

st.subheader("Chargeback")
proportional = st.toggle("Spread unallocated cost over teams", value=False,
                         help="Off: capacity nobody held is its own row. On: its cost is shared by allocated GPU-hours.")
charges = ledger["chargeback_proportional" if proportional else "chargeback"]
show.table(charges, currency, key_columns=["team", "project"])
st.caption(f"Charged {fmt.money(charges['cost'].sum(), currency, 2)} = fleet cost {fmt.money(head['fleet_cost'], currency, 2)}.")
st.download_button("Download chargeback CSV", charges.to_csv(index=False), file_name="chargeback.csv", mime="text/csv")

claims = ledger.values.get("cost_by_claim")
if claims is not None and not claims.empty:
    st.subheader("By DRA claim")
    show.table(claims, currency, key_columns=["claim", "pods", "team"])
    st.caption("GPUs held through ResourceClaims (Dynamic Resource Allocation); a MIG device costs its share of its GPU.")

st.subheader("Reclaim what-if")
percent = st.slider("Share of idle GPU-hours reclaimed (unallocated, allocated idle, hoarded), %", 0, 100, 50, step=5)
steps = ledger["reclaim"]
what_if = steps.iloc[int((steps["fraction"] - percent / 100).abs().argmin())]
r1, r2, r3 = st.columns(3)
r1.metric("Bill falls by", fmt.money(what_if["cost_reduction"], currency, 0),
          help="Released on-demand and spot capacity; reserved and owned capacity is paid for anyway.")
r2.metric("Committed capacity freed", fmt.money(what_if["committed_value_freed"], currency, 0))
r3.metric("Throughput rises by", fmt.percent(what_if["throughput_gain"]),
          help="Reclaimed hours put to work at the measured productivity of busy and underutilised hours.")

st.subheader("Buy vs rent")
show.table(ledger["buy_vs_rent"], currency, key_columns=["model"])
st.caption("Months until owning the GPUs costs less than renting the GPU-hours actually allocated, on demand, "
           "at the measured allocation and power.")
