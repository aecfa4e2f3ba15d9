"""What a bundle holds and how it is written and read: manifest, sealing, README, the one bundle reader."""
