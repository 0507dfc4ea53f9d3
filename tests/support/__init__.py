"""What only the tests run: the loopback Hub's uploads and fault switches (hubserver/), on top of the demo's
download-only hub (qwenquant.testbed.hubserver)."""
