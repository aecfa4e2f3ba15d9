"""What a bundle holds and how it is read: comparison, manifest, receipt writing, the one bundle reader."""
