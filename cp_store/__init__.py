"""Result storage on any filesystem pyarrow knows: locations (paths and URIs) and atomic batch commits."""
