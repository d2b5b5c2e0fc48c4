"""The local provider's simulated spot market: a separate, durable process on 127.0.0.1.

Modules: `clock` (market time), `book` (pools, availability, prices from a trace),
`options` (how a market is started), `state` (SQLite in the state dir), `procs`
(instance process groups), `imds` (IMDSv2 tokens and paths), `core` (the market),
`server` (HTTP), `client` (MarketClient, ensure_market).
"""
