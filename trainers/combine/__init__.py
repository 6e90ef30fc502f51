"""How the ranks' work becomes one update: one class per ``combine.method`` behind one protocol.

``config`` is the section and each method's config rules (no torch: the driver's checks import
it), ``base`` the protocol, ``combinations`` the classes and their registry, ``methods`` and
``decentral`` the math they drive.  Import the submodules directly; the order in which packages
may import each other is in ``docs/architecture.md``."""
