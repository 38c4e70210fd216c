"""Audio, voice activity detection, speech recognition, speech synthesis and transports."""
