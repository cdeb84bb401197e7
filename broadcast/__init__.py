"""On air: the avatar as a livestream host.

A moderated queue of the audience's chat questions (`broadcast.chat`) feeds turns of the
served `avatar` model; the answers and the idle life between them are rendered on the
server at a steady frame rate on one A/V clock, encoded with FFmpeg's libraries (PyAV) and
pushed to an RTMP/SRT URL, with a local preview.
"""
