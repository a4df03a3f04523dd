"""final/: the package as a whole at this level, its sub-packages in the folders below."""
