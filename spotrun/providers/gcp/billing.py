"""What Compute Engine and Cloud Storage bill, as spotrun's BillingRules (no google imports).

Every figure is sourced in docs/gcp-facts.md (section "Billing rules"):
- Instances: "All vCPUs, GPUs, and GB of memory are charged a minimum of 1 minute. [...] After
  1 minute, instances are charged in 1-second increments." (cloud.google.com/compute/
  vm-instance-pricing) -- the same for Spot and on-demand VMs.
- A Spot VM preempted in its first minute is free: "If Compute Engine preempts Spot VMs less
  than one minute after they are created, you are not billed for the use of those VMs."
  (cloud.google.com/compute/docs/instances/spot, "Preemption process", last updated
  2026-03-19); its GPUs and local SSDs likewise ("Compute Engine does not charge you for GPUs
  if their VMs are preempted in the first minute after they start running"). After the first
  minute a preempted Spot VM costs the seconds it ran: GCP has no free first hour as EC2 has.
  BillingRules expresses this as spot_reclaim_free_within_s=60 with the 60 s minimum; GCP
  counts the minute from creation, spotrun from the attempt's start (the same instant to
  within the boot time, which only makes spotrun's figure the cautious one).
- Cloud Storage Standard, one region (us-central1 and europe-west4 alike): $0.000027397 per
  GiB-hour = $0.020 per GiB-month of 730 h; Class A operations (object writes) $0.005 per
  1,000 (cloud.google.com/storage/pricing, read 2026-09-20 via api-evangelist/gcp-cloud-storage).
- Boot disk: pd-balanced $0.10 per GiB-month in us-central1 ($0.11 in europe-west4; pd-ssd
  $0.17 / $0.187) (Cloud Billing catalog via Cyclenerd pricing.yml, 2026-07-30).
BillingRules holds one price per item, so storage and disk carry the us-central1 figures.
"""

from __future__ import annotations

from spotrun.providers.billing_rules import BillingRules

GCS_STANDARD_USD_PER_GIB_MONTH = 0.020
GCS_CLASS_A_USD_PER_1000 = 0.005
PD_BALANCED_USD_PER_GIB_MONTH = 0.10
PD_SSD_USD_PER_GIB_MONTH = 0.17

GCP_RULES = BillingRules(
    provider="gcp",
    granularity_s=1.0,                 # per second after the first minute
    minimum_s=60.0,                    # "charged a minimum of 1 minute"
    spot_reclaim_free_within_s=60.0,   # preempted in its first minute: not billed
    storage_usd_per_gb_month=GCS_STANDARD_USD_PER_GIB_MONTH,
    put_requests_usd_per_1000=GCS_CLASS_A_USD_PER_1000,
    volume_usd_per_gb_month=PD_BALANCED_USD_PER_GIB_MONTH,
)
