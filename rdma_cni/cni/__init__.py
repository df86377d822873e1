"""The CNI protocol: requests, results in every spec version, errors, invoking plugins."""
