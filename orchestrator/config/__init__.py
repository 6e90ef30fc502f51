"""The config layer: what the user gives (the YAML schema, the tracking URI, the code to ship,
the command they typed) and every check on it, all before Ray starts."""
