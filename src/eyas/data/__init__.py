"""Data preparation: input readers, chat-template tokenization with loss masks, vocabulary."""
