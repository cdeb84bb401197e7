// Microphone capture on the audio thread: mono float32 at the context's rate, decimated to
// 16 kHz int16 and posted in 512-sample (32 ms) pieces to the page, which sends them as
// protocol MIC frames (0x01 + int16 PCM).
class MicProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ratio = sampleRate / 16000;
    this.position = 0;
    this.out = new Int16Array(512);
    this.filled = 0;
  }
  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    // box-filter decimation: average the input samples that fall into each output sample
    for (let i = 0; i < channel.length; i++) {
      this.sum = (this.sum || 0) + channel[i];
      this.count = (this.count || 0) + 1;
      this.position += 1;
      if (this.position >= this.ratio) {
        this.position -= this.ratio;
        const v = Math.max(-1, Math.min(1, this.sum / this.count));
        this.out[this.filled++] = v * 32767;
        this.sum = 0;
        this.count = 0;
        if (this.filled === this.out.length) {
          this.port.postMessage(this.out.slice(0));
          this.filled = 0;
        }
      }
    }
    return true;
  }
}
registerProcessor("mic-processor", MicProcessor);
