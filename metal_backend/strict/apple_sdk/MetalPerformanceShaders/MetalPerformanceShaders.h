// Stand-in for Apple's <MetalPerformanceShaders/MetalPerformanceShaders.h> (see Foundation/Foundation.h here).
#pragma once

#import <Metal/Metal.h>

@interface MPSCommandBuffer : NSObject <MTLCommandBuffer>
@end
