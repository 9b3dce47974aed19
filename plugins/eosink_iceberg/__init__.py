"""The built-in Iceberg sink of eosink (pip install "eosink[iceberg]")."""
