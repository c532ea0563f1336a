"""Twilio Media Streams (`/v1/twilio/media`): a phone call's audio over a WebSocket, as
Twilio sends and plays it."""
