"""Where a side's code comes from: sha256-pinned wheels and git commits fetched by SHA."""
