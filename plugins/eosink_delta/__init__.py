"""eosink's ``delta`` sink (Delta Lake tables through delta-rs); see ``plugin.py``."""
