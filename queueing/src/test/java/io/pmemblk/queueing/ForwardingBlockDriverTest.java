package io.pmemblk.queueing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.queueing.testing.MemoryBlockDriver.Capability;
import java.lang.foreign.ValueLayout;
import java.util.List;
import java.util.function.Function;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** A layer that overrides nothing is its device: every answer and every request goes to the device below. */
@Timeout(60)
class ForwardingBlockDriverTest {
    /** A layer that changes nothing. */
    static final class Plain extends ForwardingBlockDriver {
        Plain(BlockDriver device) {
            super(device);
        }
    }

    /** One answer of a driver, by its method's name: a new capability is one more row, asked of device and layer. */
    record Answer(String name, Function<BlockDriver, Object> of) {}

    static final List<Answer> ANSWERS = List.of(
            new Answer("size", BlockDriver::size),
            new Answer("isPmem", BlockDriver::isPmem),
            new Answer("isReadOnly", BlockDriver::isReadOnly),
            new Answer("canFlush", BlockDriver::canFlush),
            new Answer("canFua", BlockDriver::canFua),
            new Answer("canTrim", BlockDriver::canTrim),
            new Answer("canZero", BlockDriver::canZero),
            new Answer("canFastZero", BlockDriver::canFastZero),
            new Answer("canCache", BlockDriver::canCache),
            new Answer("isRotational", BlockDriver::isRotational),
            new Answer("canMultiConn", BlockDriver::canMultiConn),
            new Answer("minimumBlockSize", BlockDriver::minimumBlockSize));

    @Test
    void everyCapabilityIsTheDevicesWhateverItAnswers() {
        MemoryBlockDriver all = new MemoryBlockDriver(1 << 20);
        MemoryBlockDriver none = new MemoryBlockDriver(2 << 20).without(Capability.values());
        try {
            for (MemoryBlockDriver d : new MemoryBlockDriver[] {all, none}) {
                BlockDriver layer = new Plain(d);
                String of = d == all ? "over a device that can do everything" : "over one that can do nothing";
                for (Answer answer : ANSWERS) {
                    assertEquals(answer.of().apply(d), answer.of().apply(layer), answer.name() + " " + of);
                }
                assertSame(d, ((Plain) layer).device());
            }
            assertTrue(new Plain(all).canFua() && !new Plain(none).canFua(), "the two devices differ");
        } finally {
            all.close();
            none.close();
        }
    }

    @Test
    void requestsAndInPlaceAnswersGoToTheDeviceAndCloseClosesIt() throws Exception {
        MemoryBlockDriver d = new MemoryBlockDriver(1 << 20);
        d.receiveInPlace(true);
        Plain layer = new Plain(d);
        BlockLayer block = new BlockLayer(layer, 1, 2, 2L * BufferPool.CHUNK, BufferPool.CHUNK);
        try {
            assertEquals(1, d.attached().size(), "the queue attached to the device below");
            assertTrue(layer.receivesInPlace(0, 4096), "the device receives in place, so the layer does");
            assertFalse(layer.sendsInPlace(0, 4096), "the device does not send in place, nor does the layer");
            FrontendQueue frontend = new FrontendQueue(block.queue(0));
            Request w = frontend.acquire(4096);
            w.op = Op.WRITE;
            w.offset = 8192;
            w.length = 4096;
            w.dataBuffers()[0].put(0, (byte) 0x5a);
            int[] status = {-1};
            w.completion = r -> status[0] = r.status();
            frontend.add(w);
            frontend.dispatch();
            w.release();
            assertEquals(Status.OK, status[0], "the WRITE's status, completed by the device");
            assertEquals(1, d.requests.get(), "requests the device saw");
            assertEquals((byte) 0x5a, d.memory.get(ValueLayout.JAVA_BYTE, 8192), "the byte written, in the device");
        } finally {
            block.close();
            layer.close();
        }
        assertFalse(d.memory.scope().isAlive(), "closing the layer closed the device");
    }

    @Test
    void aLayerOverNothingIsRefused() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> new Plain(null));
        assertTrue(e.getMessage().contains("device below"), e.getMessage());
    }
}
