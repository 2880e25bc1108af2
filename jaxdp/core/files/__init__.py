"""What the commands read and write: whole files, paths checked first, the checkpoint folder."""
