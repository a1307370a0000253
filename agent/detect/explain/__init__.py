"""What grows and why: suspects from heap histograms (classes, types, containers, sites), what holds
them, in which layer RSS grows, diffs of two snapshots. It reads the stored histograms
(`agent/state`) and the records and tests shared at `agent/detect/`, never a detector."""
