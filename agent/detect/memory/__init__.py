"""The memory detectors: leak, oom-risk and fragmentation, judged on growth fitted at several time
scales, and their replay over one instance (`engine`) or a whole fleet (`fleet`). They import only
the records and tests shared at `agent/detect/`."""
