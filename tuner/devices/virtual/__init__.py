"""Boards that touch no hardware: the digital twins (``sim:``), the Server queue they serve
through, generated boards (``gen:``) and a real card's recorded windows (``measured:``)."""
