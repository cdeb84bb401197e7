"""The audience's chat: messages from a platform (IRC, the protocol Twitch chat speaks) or the
operator's HTTP/WebSocket input, moderated into a queue of questions for the anchor."""
