"""The self-service portal's requests: team templates, validation, the Job a request becomes, and
where it goes (the Kubernetes API or the scheduler's endpoint). The dashboards show it."""
