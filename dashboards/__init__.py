"""Dashboards: the HTML dashboard's static files, a Grafana dashboard and Prometheus alerting rules."""
